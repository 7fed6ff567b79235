"""A damaged newest message through the NATS listener (issue 27): nats-py's
``kv.get`` (direct gets and ``STREAM.MSG.GET``), ``get_last_msg`` and direct gets by
subject get the store-failure error that names the damaged record (``503 10077``; a
direct get: status ``500`` with the text), never the previous revision and never
"not found" (``docs/semantics.md`` §3.4, §18.31).

A real broker with its NATS listener, stopped, a byte flipped in its ``.log`` file,
started again; nats-py reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nats
import nats.js.errors as jse
from conftest import start_server
from helpers import REPAIR, flip_last_payload_byte, in_asyncio, partition_dir

from broker import Config


async def test_the_issue_reproduction_through_nats_py(nats_config: Config, data_dir: Path) -> None:
    """Issue 27, defect 3, with nats-py: put ``old``, put ``new``, flip the last
    payload byte of the newest record, restart; ``kv.get`` raises the store failure
    naming revision 2 (it used to return ``old``, revision 1), not KeyNotFoundError."""
    async def fill(url: str) -> None:
        nc = await nats.connect(url)
        kv = await nc.jetstream().create_key_value(bucket="cfg", history=5)
        assert [await kv.put("mode", b"old"), await kv.put("mode", b"new")] == [1, 2]
        await nc.close()

    async def get(url: str) -> tuple[str, int | None, int | None, str | None]:
        nc = await nats.connect(url)
        try:
            await (await nc.jetstream().key_value("cfg")).get("mode")
        except jse.KeyNotFoundError as err:
            return ("KeyNotFoundError", err.code, err.err_code, err.description)
        except jse.APIError as err:
            return (type(err).__name__, err.code, err.err_code, err.description)
        finally:
            await nc.close()
        return ("ok", None, None, None)

    async with start_server(nats_config) as h:
        assert h.nats_url is not None
        await in_asyncio(fill, h.nats_url)
        part = partition_dir(h, "kv", "cfg")
    flip_last_payload_byte(part, 2)
    async with start_server(nats_config) as h:
        assert h.nats_url is not None
        got = await in_asyncio(get, h.nats_url)
    assert got == (
        "ServiceUnavailableError", 503, 10077,
        "the newest revision of key '$KV.cfg.mode' in bucket 'cfg' is damaged: revision 2 cannot be read, and no "
        f"older revision is served in its place {REPAIR}",
    )


async def test_nats_py_gets_the_damage_error_never_the_previous_revision(nats_config: Config, data_dir: Path) -> None:
    async def fill(url: str) -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="cfg", history=5, direct=True)
        assert [await kv.put("mode", b"old"), await kv.put("mode", b"new"), await kv.put("other", b"x")] == [1, 2, 3]
        await js.add_stream(name="S", subjects=["s.>"], allow_direct=True)
        assert [(await js.publish("s.a", b"old")).seq, (await js.publish("s.a", b"new")).seq] == [1, 2]
        await nc.close()

    async with start_server(nats_config) as h:
        assert h.nats_url is not None
        await in_asyncio(fill, h.nats_url)
        kv_dir, s_dir = partition_dir(h, "kv", "cfg"), partition_dir(h, "nats", "s")
    flip_last_payload_byte(kv_dir, 2)
    flip_last_payload_byte(s_dir, 2)

    async def read(url: str) -> dict[str, Any]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        out: dict[str, Any] = {}

        async def attempt(name: str, coro: Any) -> None:
            try:
                got = await coro
            except jse.APIError as err:
                out[name] = (type(err).__name__, err.code, err.err_code, err.description)
            else:
                out[name] = ("ok", getattr(got, "value", None) or getattr(got, "data", None))

        kv = await js.key_value("cfg")
        for direct in (True, False):
            kv._direct = direct  # nats-py's choice of request, as the bucket's allow_direct sets it
            await attempt(f"kv.get direct={direct}", kv.get("mode"))
            await attempt(f"kv.get rev 1 direct={direct}", kv.get("mode", revision=1))
            await attempt(f"kv.get rev 2 direct={direct}", kv.get("mode", revision=2))
            await attempt(f"kv.get other direct={direct}", kv.get("other"))
        await attempt("get_last_msg", js.get_last_msg("S", "s.a"))
        await attempt("direct get by subject", js.get_msg("S", subject="s.a", direct=True))
        await attempt("get_msg by filter", js.get_msg("S", subject="s.*"))
        await attempt("get_msg seq 2", js.get_msg("S", seq=2))
        await attempt("get_msg seq 1", js.get_msg("S", seq=1))
        out["still usable"] = (await js.publish("s.b", b"after")).seq
        await nc.close()
        return out

    async with start_server(nats_config) as h:
        assert h.nats_url is not None
        out = await in_asyncio(read, h.nats_url)
    kv_text = (
        "the newest revision of key '$KV.cfg.mode' in bucket 'cfg' is damaged: revision 2 cannot be read, and no "
        f"older revision is served in its place {REPAIR}"
    )
    s_text = (
        "the last message on subject 's.a' in stream 'S' is damaged: sequence 2 cannot be read, and no older "
        f"message is served in its place {REPAIR}"
    )
    kv_rev = "message 2 of stream 'KV_cfg' cannot be read: the record is damaged (`ttlbroker repair` writes it off)"
    s_rev = "message 2 of stream 'S' cannot be read: the record is damaged (`ttlbroker repair` writes it off)"
    assert out == {
        "kv.get direct=True": ("APIError", 500, None, kv_text),
        "kv.get rev 1 direct=True": ("ok", b"old"),
        "kv.get rev 2 direct=True": ("APIError", 500, None, kv_rev),
        "kv.get other direct=True": ("ok", b"x"),
        "kv.get direct=False": ("ServiceUnavailableError", 503, 10077, kv_text),
        "kv.get rev 1 direct=False": ("ok", b"old"),
        "kv.get rev 2 direct=False": ("ServiceUnavailableError", 503, 10077, kv_rev),
        "kv.get other direct=False": ("ok", b"x"),
        "get_last_msg": ("ServiceUnavailableError", 503, 10077, s_text),
        "direct get by subject": ("APIError", 500, None, s_text),
        "get_msg by filter": ("ServiceUnavailableError", 503, 10077, (
            "the last message matching 's.*' in stream 'S' (on subject 's.a') is damaged: sequence 2 cannot be read, "
            f"and no older message is served in its place {REPAIR}"
        )),
        "get_msg seq 2": ("ServiceUnavailableError", 503, 10077, s_rev),
        "get_msg seq 1": ("ok", b"old"),
        "still usable": 3,
    }
