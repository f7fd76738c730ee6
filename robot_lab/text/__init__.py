"""Text helpers shared by every layer (no robot_lab imports beyond errors): TF-IDF and
stemming, front matter, bytes-to-str."""
