"""The message bus between robots (robot_lab's TypedBus, on Redis Streams): a robot served
by a poller answers requests from another robot; a malformed message published by hand goes
to the dead-letter stream and the poller carries on.

    python examples/08_message_bus.py
    REDIS_URL=redis://localhost:6379/0 python examples/08_message_bus.py   # same, on a real server
"""

import robot_lab
from robot_lab.bus import Bus, BusPoller
from robot_lab.logging import configure_logging
from robot_lab.settings import get_settings

configure_logging(level="WARNING", force=True)
OFFLINE = get_settings().default_model().startswith("scripted/")

bus = Bus()
librarian = robot_lab.build(name="librarian08", model="scripted/text:The library opens at 9 am." if OFFLINE else None,
                            system_prompt="You answer questions about the library in one sentence.")
bus.register("librarian08")
visitor = BusPoller("visitor08", bus)  # the visitor's own inbox: replies to its send_message land there
with BusPoller("librarian08", bus).serve(librarian), visitor:  # poller threads; a worker runs the same
    reply = bus.request("librarian08", "When do you open?", from_="visitor08", timeout=30)
    print(f"{reply.from_} -> {reply.to}: {reply.content} (in reply to {reply.in_reply_to})")

    # robot_lab's send_message: fire, then look at the outbox when the reply came back
    sent = bus.send_message("librarian08", "Do you lend e-books?", from_="visitor08")
    bus.wait_for_reply("visitor08", sent.id, timeout=30)
    print("outbox status:", bus.outbox("visitor08", sent.id).status)

    # anything can publish with a plain XADD; a bad envelope is dead-lettered, not lost
    bus.redis.xadd(bus.keys.inbox("librarian08"), {"envelope": b'{"to": "librarian08"}'})
    reply = bus.request("librarian08", "Still there?", from_="visitor08", timeout=30)
    print("still serving:", reply.content)
[letter] = bus.dead_letters("librarian08")
print(f"dead letter: reason={letter.reason} error={letter.error}")
bus.purge_dead_letters("librarian08")
