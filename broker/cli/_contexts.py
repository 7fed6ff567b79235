"""Contexts: named sets of connection options (``ttlbroker context add|select|
unselect|ls|info|rm``), kept as natscli keeps its own (jsm.go ``natscontext``).

Each context is a JSON file, ``$XDG_CONFIG_HOME/ttlbroker/context/NAME.json``
(``~/.config/ttlbroker/...`` without the variable), with natscli's keys for what
ttlbroker has: ``description``, ``url`` (``--server``), ``user``, ``password``,
``token``, ``ca``, ``cert``, ``key`` (the ``--tls-*`` files, as absolute paths), and
``tls`` (``--tls``, which natscli has no key for). Keys ttlbroker does not know (a
file copied from natscli's directory) are kept as they are. The selected
context's name is in ``$XDG_CONFIG_HOME/ttlbroker/context.txt``. Files are written
0600 (they may hold a password or a token) by an atomic replace, the directories
made 0700. A name is natscli's: not empty, no ``..``, no ``/`` or ``\\``.

Every client command takes ``--context NAME`` (default ``$TTLBROKER_CONTEXT``,
else the selected context). For each connection option the command line wins, then
its environment variable (``$TTLBROKER_SERVER``, ...), then the context, then the
built-in default. The credentials (``token``, ``user``, ``password``) go as a set:
when the command line or the environment gives any of them, the context's are not
used, so that a token is never sent with another user's password.

``context add NAME`` stores what its command line gives (never what comes from the
environment); for an existing context it changes only what is given.

The files are read and written through ``storage``'s file primitives: the broker
package touches no file itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import storage

from ._args import ENV, given
from ._confirm import confirm
from ._exits import CliError, fail, say
from ._output import Out
from ._tables import value_text

__all__ = ["ContextError", "apply_context", "cmd_context", "context_dir", "selected_file", "FIELDS"]

#: Connection option (``args`` attribute) -> the context's key.
FIELDS = {
    "server": "url", "user": "user", "password": "password", "token": "token",
    "tls": "tls", "tls_ca": "ca", "tls_cert": "cert", "tls_key": "key",
}
_CREDENTIALS = ("token", "user", "password")
_FILES = ("tls_ca", "tls_cert", "tls_key")
#: What a new context holds before its options are given (natscli writes every key).
_BLANK: dict[str, Any] = {"description": "", "url": "", "user": "", "password": "", "token": "",
                          "ca": "", "cert": "", "key": "", "tls": False}


class ContextError(Exception):
    """A context that cannot be used; the message says which and why."""


def _root() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(base, "ttlbroker")


def context_dir() -> str:
    return os.path.join(_root(), "context")


def selected_file() -> str:
    return os.path.join(_root(), "context.txt")


def _path(name: str) -> str:
    return os.path.join(context_dir(), name + ".json")


def _check_name(name: str) -> str:
    if not name:
        raise ContextError("a context's name cannot be empty")
    if ".." in name:
        raise ContextError(f'invalid context name "{name}": it must not contain ".."')
    if "/" in name or "\\" in name:
        raise ContextError(f'invalid context name "{name}": it must not contain "/" or "\\"')
    return name


def names() -> list[str]:
    return [n for n in storage.file_names(context_dir(), ".json") if ".." not in n and "\\" not in n]


def selected() -> str | None:
    try:
        raw = storage.read_if_exists(selected_file())
    except OSError as exc:
        raise ContextError(f"cannot read {selected_file()}: {exc.strerror or exc}") from None
    name = raw.decode(errors="replace").strip() if raw else ""
    return name or None


def load(name: str) -> dict[str, Any]:
    """The context's keys. Raises ContextError: no such context, or not one."""
    path = _path(_check_name(name))
    try:
        raw = storage.read_if_exists(path)
    except OSError as exc:
        raise ContextError(f'cannot read context "{name}" ({path}): {exc.strerror or exc}') from None
    if raw is None:
        known = names()
        hint = f"known: {', '.join(known)}" if known else "there is none yet: ttlbroker context add NAME --server HOST:PORT"
        raise ContextError(f'unknown context "{name}" ({hint})')
    try:
        ctx = json.loads(raw)
    except ValueError as exc:
        raise ContextError(f'context "{name}" ({path}) is not JSON: {exc}') from None
    if not isinstance(ctx, dict):
        raise ContextError(f'context "{name}" ({path}) is not a JSON object')
    for key in FIELDS.values():
        want = bool if key == "tls" else str
        if key in ctx and not isinstance(ctx[key], want):
            raise ContextError(f'context "{name}" ({path}): "{key}" must be {"true or false" if want is bool else "a string"}')
    return ctx


def _write(path: str, data: bytes) -> None:
    try:
        storage.makedirs(os.path.dirname(path), mode=0o700)
        storage.atomic_write(path, data, mode=0o600)
    except OSError as exc:
        raise ContextError(f"cannot write {path}: {exc.strerror or exc}") from None


def _select(name: str | None) -> None:
    if name is None:
        try:
            storage.remove_file(selected_file())
        except OSError as exc:
            raise ContextError(f"cannot remove {selected_file()}: {exc.strerror or exc}") from None
    else:
        _write(selected_file(), name.encode())


# -- using a context ------------------------------------------------------------------


def _from_environment(dest: str) -> bool:
    return dest in ENV and bool(os.environ.get(ENV[dest]))


def apply_context(args: argparse.Namespace) -> None:
    """Fill in the connection options that neither the command line nor the
    environment gave from the context (``--context``, ``$TTLBROKER_CONTEXT`` or the
    selected one), if any.

    Raises:
        ContextError: that context does not exist or cannot be read.
    """
    name = getattr(args, "context", None) or selected()
    if not name:
        return
    ctx = load(name)
    credentials_given = any(given(args, d) or _from_environment(d) for d in _CREDENTIALS)
    for dest, key in FIELDS.items():
        if given(args, dest) or _from_environment(dest) or (dest in _CREDENTIALS and credentials_given):
            continue
        if ctx.get(key):
            setattr(args, dest, ctx[key])


# -- the context commands ---------------------------------------------------------------


def _masked(ctx: dict[str, Any]) -> dict[str, Any]:
    return {k: ("*" * len(v) if k in ("password", "token") and isinstance(v, str) else v) for k, v in ctx.items()}


def _show(out: Out, name: str, ctx: dict[str, Any]) -> None:
    """natscli's ``context info``: what is set, the password and the token masked,
    then a warning on stderr for the environment variables that override it."""
    is_selected = selected() == name
    if out.json:
        out.obj({"name": name, "selected": is_selected, "path": _path(name), **_masked(ctx)})
    else:
        c = _masked(ctx)
        labels = (("description", "description"), ("url", "server"), ("user", "user"), ("password", "password"),
                  ("token", "token"), ("tls", "tls"), ("ca", "tls ca"), ("cert", "tls cert"), ("key", "tls key"))
        fields = [(label, value_text(c[key])) for key, label in labels if c.get(key)]
        known = {key for key, _ in labels}
        fields += [(k.replace("_", " "), value_text(v)) for k, v in c.items() if k not in known and v not in ("", None, False, [])]
        fields.append(("path", _path(name)))
        out.fields(f'Context "{name}"' + (" (selected)" if is_selected else ""), fields)
    overrides = [f"${ENV[d]}" for d in FIELDS if _from_environment(d) and ctx.get(FIELDS[d])]
    if overrides:
        print(f"warning: the environment overrides this context: {', '.join(overrides)}", file=sys.stderr)


def _add(args: argparse.Namespace, out: Out) -> None:
    name = _check_name(args.name)
    ctx = load(name) if name in names() else dict(_BLANK)
    for dest, key in FIELDS.items():
        if given(args, dest):
            value = getattr(args, dest)
            ctx[key] = os.path.abspath(value) if dest in _FILES and value else value
    if args.description is not None:
        ctx["description"] = args.description
    if ctx.get("token") and (ctx.get("user") or ctx.get("password")):
        raise ContextError("a context holds a token or a user and a password, not both")
    _write(_path(name), (json.dumps(ctx, indent=2) + "\n").encode())
    if args.select:
        _select(name)
    _show(out, name, ctx)


def _list(out: Out) -> None:
    current = selected()
    found = []
    for name in names():
        try:
            found.append((name, load(name)))
        except ContextError as exc:  # one bad file does not hide the others (natscli logs and goes on)
            say(f"error: {CliError.INVALID_CONTEXT.name}: {exc}")
    if out.json:
        for name, ctx in found:
            out.obj({"name": name, "description": ctx.get("description", ""), "url": ctx.get("url", ""),
                     "selected": name == current})
    elif found:
        out.table(["NAME", "DESCRIPTION"], [[name + ("*" if name == current else ""), str(ctx.get("description", ""))]
                                            for name, ctx in found], title="Known Contexts")
    else:
        out.note("No known contexts")


def _remove(args: argparse.Namespace, out: Out) -> int:
    name = _check_name(args.name)
    load(name)  # it exists, and is a context
    is_selected = selected() == name
    if is_selected and not args.force:
        raise ContextError(f'cannot remove the selected context "{name}": select another one, '
                           "use ttlbroker context unselect, or give --force")
    if not args.force and not confirm(f'Really delete context "{name}"'):
        print(f'not confirmed: context "{name}" is left as it was', file=sys.stderr)
        return 0
    if is_selected:
        _select(None)
    try:
        storage.remove_file(_path(name))
    except OSError as exc:
        raise ContextError(f"cannot remove {_path(name)}: {exc.strerror or exc}") from None
    out.obj({"deleted": name}, f'deleted context "{name}"')
    return 0


def cmd_context(args: argparse.Namespace) -> int:
    """Run ``ttlbroker context ACTION``; returns the exit status (1 and one line on
    stderr for a context that cannot be used)."""
    out = Out(args.json)
    try:
        if args.action == "add":
            _add(args, out)
        elif args.action == "select":
            _check_name(args.name)
            ctx = load(args.name)
            _select(args.name)
            _show(out, args.name, ctx)
        elif args.action == "unselect":
            current = selected()
            _select(None)
            out.obj({"unselected": current}, f'unselected the "{current}" context' if current else "No context currently selected")
        elif args.action == "ls":
            _list(out)
        elif args.action == "info":
            name = args.name or selected()
            if not name:
                raise ContextError("no context is selected and no name was given")
            _show(out, name, load(name))
        elif args.action == "rm":
            return _remove(args, out)
    except ContextError as exc:
        return fail(CliError.INVALID_CONTEXT, str(exc)).status
    return 0
