"""Signed envelopes benchmark: publish -> BusPoller -> handler -> ack, unsigned with
verification off beside signed with ``require``, in one run on one Redis.

    .venv/bin/python bench/signing.py --url redis://127.0.0.1:6379/0 [--count 3000] [--rounds 3]

msgs/s = count / (publish + consume time), 200-byte contents, a no-op ``on_message`` handler.
Also prints the cost of one ``Keyring.sign`` and one ``Keyring.problem`` (the check) alone.
Uses a unique key prefix on the given server and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from robot_lab.bus import Bus, BusPoller, Keyring  # noqa: E402
from robot_lab.keys import Keys  # noqa: E402
from robot_lab.schemas import RobotMessage, encode_message  # noqa: E402

KEYS = {"client": {"k1": "client-key-0001-0123456789abcdef"}}
PAYLOAD = "x" * 200


def run(client: redis.Redis, count: int, signed: bool) -> float:
    keys = Keys(prefix=f"bench-sign-{uuid.uuid4().hex[:8]}")
    ring = Keyring(KEYS) if signed else Keyring()
    bus = Bus(client, keys=keys, keyring=ring)
    bus.register("billing")
    poller = BusPoller("billing", Bus(client, keys=keys, keyring=Keyring(KEYS)), block_ms=0,
                       verify="require" if signed else "off").on_message(lambda m: None)
    start = time.perf_counter()
    for _ in range(count):
        bus.publish("billing", PAYLOAD, from_="client")
    done = 0
    while done < count:
        done += poller.poll()
    elapsed = time.perf_counter() - start
    assert poller.counts["acked"] == count, poller.counts
    for key in client.scan_iter(match=f"{keys.prefix}*"):
        client.delete(key)
    return count / elapsed


def micro(n: int = 5000) -> tuple[float, float]:
    ring = Keyring(KEYS)
    message = RobotMessage(to="billing", content=PAYLOAD, from_="client")
    start = time.perf_counter()
    for _ in range(n):
        signed = ring.sign(message)
    sign_us = (time.perf_counter() - start) / n * 1e6
    raw = encode_message(signed)
    start = time.perf_counter()
    for _ in range(n):
        assert not ring.problem(raw, signed)
    return sign_us, (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    client = redis.Redis.from_url(args.url)
    plain = max(run(client, args.count, False) for _ in range(args.rounds))
    signed = max(run(client, args.count, True) for _ in range(args.rounds))
    sign_us, check_us = micro()
    print(f"unsigned, verify off   : {plain:8.0f} msgs/s")
    print(f"signed, verify require : {signed:8.0f} msgs/s  (ratio {signed / plain:.2f})")
    print(f"sign one envelope      : {sign_us:8.1f} us;  check one: {check_us:.1f} us")


if __name__ == "__main__":
    main()
