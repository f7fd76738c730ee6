"""No password reaches printed text, for every URL form robot-lab accepts.

A hypothesis property over generated passwords (raw "/", "#", "?", "@", ":" and
%-escapes included) and URL forms; plus the errors ``connect`` raises for a bad URL."""

from __future__ import annotations

from urllib.parse import quote, unquote

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from robot_lab.connection import connect, parse_redis_url, redact_url
from robot_lab.errors import ConfigurationError

FORMS = {  # scheme -> host part (several hosts where the form allows them)
    "redis": "cache.example:6380/2",
    "rediss": "cache.example/0",
    "unix": "/run/redis/redis.sock?db=1",
    "redis+sentinel": "sent-a:26379,sent-b:26380/mymaster/1",
    "rediss+sentinel": "sent-a/mymaster",
    "redis+cluster": "node-a:7000,node-b:7001",
    "rediss+cluster": "node-a:7000",
}
HOSTS = {"redis": "cache.example", "rediss": "cache.example", "unix": "/run/redis/redis.sock",
         "redis+sentinel": "sent-b", "rediss+sentinel": "sent-a", "redis+cluster": "node-b",
         "rediss+cluster": "node-a"}
passwords = st.text(alphabet="abcXYZ0189+=-_/#?@:%.~!$", min_size=6, max_size=24)


def _build(scheme: str, password: str, how: str, user: str) -> str:
    hosts = FORMS[scheme]
    if how == "query":
        sep = "&" if "?" in hosts else "?"
        name = "sentinel_password" if "sentinel" in scheme else "password"
        return f"{scheme}://{hosts}{sep}{name}={quote(password, safe='')}"
    secret = quote(password, safe="") if how == "escaped" else password
    userinfo = f"{user}:{secret}" if user else (f":{secret}" if how != "bare" else secret)
    return f"{scheme}://{userinfo}@{hosts}"


@settings(max_examples=400, deadline=None)
@given(scheme=st.sampled_from(sorted(FORMS)), password=passwords,
       how=st.sampled_from(["raw", "escaped", "bare", "query"]), user=st.sampled_from(["", "app-user"]))
def test_redacted_url_never_holds_the_password_and_keeps_the_host(scheme, password, how, user):
    url = _build(scheme, password, how, user)
    decoded = unquote(password)
    skeleton = url.replace(password, "").replace(quote(password, safe=""), "")
    # a password that is a piece of the URL around it (or names a query parameter) is ambiguous
    assume(password not in skeleton and decoded not in skeleton and "password=" not in password)
    assume(not (how == "bare" and ":" in password))  # "a:b@host" is user "a", password "b"
    red = redact_url(url)
    assert password not in red and decoded not in red and quote(password, safe="") not in red
    assert HOSTS[scheme] in red and red.startswith(f"{scheme}://")
    if user and how != "query":
        assert f"{user}:***@" in red


@settings(max_examples=150, deadline=None)
@given(scheme=st.sampled_from(["redis", "rediss", "redis+sentinel", "redis+cluster"]), password=passwords)
def test_raw_passwords_parse_whole(scheme, password):
    """A raw "/", "#", "?" or "@" in a password does not cut it (nor leak it into a host)."""
    assume("%" not in password and not password.startswith(":"))
    parsed = parse_redis_url(_build(scheme, password, "raw", "app-user"))
    assert parsed.password == password and parsed.username == "app-user"
    assert all(password not in host for host, _ in parsed.hosts)


@pytest.mark.parametrize("url", [
    "redis://:Ab3/xyZ+9q==@cache:6379/0?socket_timeout=zz",  # redis-py's own ValueError
    "redis://app:Ab3/xyZ+9q==@cache:notaport/0",
    "rediss://:Ab3%2FxyZ%2B9q==@cache/0?health_check_interval=x",
    "unix://:Ab3/xyZ+9q==@/run/redis.sock?db=q",
    "redis+sentinel://:Ab3/xyZ+9q==@s1:26379/mymaster?socket_timeout=zz",
    "rediss+sentinel://:Ab3/xyZ+9q==@s1:26379",
    "redis+cluster://:Ab3/xyZ+9q==@c1:7000/3",
    "rediss+cluster://u:Ab3#xyZ?9q==@c1:abc",
    "redis://cache/0?password=Ab3%2FxyZ%2B9q%3D%3D&socket_timeout=zz",
])
def test_connect_errors_carry_no_password(url):
    with pytest.raises(ConfigurationError) as info:
        connect(url)
    text = str(info.value)
    assert "Ab3" not in text and "xyZ" not in text, text
    assert "Redis URL" in text
