"""The edge's decisions: which Host names and web origins are served, which bodies count as JSON, and which binds
need a key."""

from __future__ import annotations

import pytest

from blazar.api.edge import EdgePolicy, host_name, is_loopback, json_content_type
from blazar.daemon import UnsafeBind, check_bind


@pytest.mark.parametrize(("header", "name"), [("localhost:11435", "localhost"), ("[::1]:80", "::1"), ("[::1]", "::1"),
                                              ("127.0.0.1", "127.0.0.1"), ("LocalHost.", "localhost"),
                                              ("::1", "::1")])
def test_host_name_strips_the_port_and_brackets(header: str, name: str) -> None:
    assert host_name(header) == name


def test_a_loopback_bind_serves_only_loopback_names_and_allowed_hosts() -> None:
    policy = EdgePolicy.of("127.0.0.1", ["blazar.internal"], [])
    for ok in ("localhost", "localhost:11435", "127.0.0.1:1", "[::1]:11435", "blazar.internal:8080"):
        assert policy.host_allowed(ok), ok
    for refused in ("rebind.attacker.example:11435", "127.0.0.1.nip.io", "", None, "192.168.1.5"):
        assert not policy.host_allowed(refused), refused


def test_a_specific_bind_serves_its_own_address_and_a_wildcard_any_unless_narrowed() -> None:
    assert EdgePolicy.of("10.1.2.3", [], []).host_allowed("10.1.2.3:11435")
    assert not EdgePolicy.of("10.1.2.3", [], []).host_allowed("evil.example")
    assert EdgePolicy.of("0.0.0.0", [], []).host_allowed("box.lan:11435")
    narrowed = EdgePolicy.of("0.0.0.0", ["box.lan"], [])
    assert narrowed.host_allowed("box.lan") and not narrowed.host_allowed("evil.example")


def test_origins_are_allowed_by_the_list_by_being_our_own_and_star_only_with_keys() -> None:
    policy = EdgePolicy.of("127.0.0.1", [], ["https://app.example/"])
    own = "http://localhost:11435"
    assert policy.origin_allowed("https://app.example", own=own, keys_on=False)
    assert policy.origin_allowed("http://localhost:11435", own=own, keys_on=False)
    assert not policy.origin_allowed("https://evil.example", own=own, keys_on=True)
    assert not policy.origin_allowed("null", own=own, keys_on=False)
    star = EdgePolicy.of("127.0.0.1", [], ["*"])
    assert not star.origin_allowed("https://any.example", own=own, keys_on=False)
    assert star.origin_allowed("https://any.example", own=own, keys_on=True)
    assert star.cors("https://any.example", keys_on=True) and not star.cors("https://any.example", keys_on=False)


@pytest.mark.parametrize(("value", "ok"), [(None, True), ("", True), ("application/json", True),
                                           ("application/json; charset=utf-8", True), ("application/vnd.x+json", True),
                                           ("text/plain;charset=UTF-8", False), ("application/x-www-form-urlencoded",
                                                                                  False),
                                           ("multipart/form-data; boundary=x", False)])
def test_only_json_bodies_count(value: str | None, ok: bool) -> None:
    assert json_content_type(value) is ok


def test_a_wide_bind_needs_a_key_or_the_insecure_flag() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback(host)
        assert check_bind(host, keys_on=False, insecure_no_auth=False) is None
    assert check_bind("0.0.0.0", keys_on=True, insecure_no_auth=False) is None
    with pytest.raises(UnsafeBind, match="blazar keys create"):
        check_bind("0.0.0.0", keys_on=False, insecure_no_auth=False)
    with pytest.raises(UnsafeBind):
        check_bind("192.168.1.10", keys_on=False, insecure_no_auth=False)
    warning = check_bind("::", keys_on=False, insecure_no_auth=True)
    assert warning is not None and "no API key" in warning
