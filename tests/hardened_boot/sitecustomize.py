"""Runs as every Python process starts when this folder is on PYTHONPATH, which only the
hardened test profile does (tests/hardened.py): the process gets the Redis user, signing keys
and mount namespace of its role before its program runs."""

from tests.hardened import boot

boot()
