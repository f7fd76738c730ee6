"""``robot-lab dashboard``: a Starlette app over Redis (data.py: the reads and the two
actions; server.py: routes, SSE, auth; static/: one HTML page, one script, one stylesheet --
no front-end build step). A layer above workers: it reuses the status readers."""
