"""protocol/_jetstream.py: stream configs to topic options and back, Go times, and
that any JSON a client can send either maps or is refused with a JSError
(hypothesis)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from protocol.nats import NS, JSError, rfc3339, stream_config, stream_config_to_topic

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_FIELDS = [
    "name", "subjects", "retention", "storage", "num_replicas", "max_age", "max_msgs", "max_bytes", "max_msg_size",
    "max_msgs_per_subject", "duplicate_window", "subject_delete_marker_ttl", "allow_msg_ttl", "deny_purge",
    "deny_delete", "allow_rollup_hdrs", "allow_direct", "discard", "mirror", "sources", "republish", "metadata",
    "description", "compression", "first_seq", "sealed", "placement",
]


@given(st.dictionaries(st.sampled_from(_FIELDS) | st.text(max_size=6), _json, max_size=8))
def test_any_config_maps_or_is_refused(cfg: dict[str, Any]) -> None:
    try:
        options, max_age = stream_config_to_topic(cfg)
    except JSError as err:
        assert err.code in (400, 500) and err.err_code > 10000 and err.description
        return
    assert max_age >= 0 and options["nats"]["name"] == cfg["name"]


@given(
    st.integers(0, 10**6), st.integers(0, 1000), st.integers(0, 100), st.booleans(), st.booleans(),
    st.integers(0, 3600), st.sampled_from(["old", "new"]),
)
def test_config_round_trip(age: int, window: int, per_subject: int, ttl: bool, purge: bool, sdm: int, discard: str) -> None:
    cfg = {
        "name": "S", "subjects": ["s.>"], "max_age": age * NS, "duplicate_window": window * NS,
        "max_msgs_per_subject": per_subject or -1, "allow_msg_ttl": ttl, "deny_purge": purge,
        "subject_delete_marker_ttl": sdm * NS, "discard": discard, "num_replicas": 1, "storage": "file",
    }
    options, max_age = stream_config_to_topic(cfg)
    options.setdefault("duplicate_window", 120)
    options["republish"] = None
    back = stream_config(options, max_age, "s")
    for key in ("name", "subjects", "max_age", "max_msgs_per_subject", "allow_msg_ttl", "deny_purge", "discard"):
        assert back[key] == cfg[key], key
    assert back.get("subject_delete_marker_ttl", 0) == cfg["subject_delete_marker_ttl"]
    assert back["duplicate_window"] == (window or 120) * NS


@given(st.integers(1, 253402300799 * NS))
def test_rfc3339_is_gos_time_format(ns: int) -> None:
    secs, frac = divmod(ns, NS)
    want = dt.datetime.fromtimestamp(secs, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        want += "." + f"{frac:09d}".rstrip("0")
    assert rfc3339(ns) == want + "Z"
