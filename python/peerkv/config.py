"""Checking a peerkv tier configuration without loading the library.

A vLLM ``secondary_tiers`` entry for peerkv holds vLLM's own keys (``type``,
``module_path``), a few keys the Python tier consumes (``backends``,
``num_threads``, ``prefix_caching_hash_algo``, ``locality``) and options of
the library (``peerkv_create``). The library's options, their types, bounds
and the wording of their errors come from one table in Go
(core/config/schema.go), exported into ``peerkv._options_schema``; the Go
side checks the same table again when the peer is created. Nothing here
loads libpeerkv.so, so vLLM's API-server process can call it.

    >>> check_tier_config({"type": "peerkv", "prot": 5710})
    Traceback (most recent call last):
    ...
    peerkv.config.PeerKVConfigError: peerkv tier configuration: unknown option "prot" (did you mean "port"?)
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import socket
from collections.abc import Mapping
from typing import Any

from peerkv._options_schema import DIGEST, SCHEMA

__all__ = [
    "DIGEST",
    "PeerKVConfigError",
    "Problem",
    "check_tier_config",
    "library_options",
    "suggest",
    "tier_keys",
]

OPTIONS: dict[str, dict[str, Any]] = {o["name"]: o for o in SCHEMA["options"]}

# vLLM's keys of a secondary_tiers entry, read by its SecondaryTierFactory.
_VLLM_KEYS: dict[str, dict[str, Any]] = {
    "type": {"type": "string", "want": "a string"},
    "module_path": {"type": "string", "want": "a string"},
    "backpressure": {"type": "any"},  # refused below, with the reason
}

# Keys the Python tier consumes: aliases of library options (the names
# vLLM's built-in p2p tier uses) and the identity's hash algorithm.
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
_TIER_KEYS: dict[str, dict[str, Any]] = {
    "backends": {"type": "string_list", "want": "a list of strings", "alias_of": "nixl_backends"},
    "num_threads": {**OPTIONS["nixl_num_threads"], "name": "num_threads", "alias_of": "nixl_num_threads"},
    "prefix_caching_hash_algo": {
        "type": "string",
        "enum": list(HASH_ALGOS),
        "want": "one of " + ", ".join(f'"{a}"' for a in HASH_ALGOS),
    },
    "locality": {"type": "any"},  # accepted and ignored: peers are always remote
}

_WILDCARDS = ("0.0.0.0", "::", "*", "0:0:0:0:0:0:0:0")

# The default TCP data port is the control port plus this (core/config.DataPortOffset).
DATA_PORT_OFFSET = 1000

# Where the auth secret may come from besides the tier (core/config.SecretEnv).
SECRET_ENV = "PEERKV_AUTH_SECRET"

# vLLM's p2p environment variables the tier reads, and the library option
# each one sets when the tier does not. vLLM reads them with int()
# (vllm/envs.py), so anything else fails the engine; the library reads
# VLLM_P2P_IDLE_TIMEOUT_S itself, as a number (core/config), 0 or less
# turning idle eviction off.
_P2P_ENV: dict[str, tuple[str, type]] = {
    "VLLM_P2P_SIDE_CHANNEL_PORT": ("port", int),
    "VLLM_P2P_MAX_PEERS": ("max_peers", int),
    "VLLM_P2P_HANDSHAKE_TIMEOUT_S": ("handshake_timeout_s", int),
    "VLLM_P2P_IDLE_TIMEOUT_S": ("idle_timeout_s", float),
}


class Problem(str):
    """One problem (or warning) of a configuration: its text, which names
    the key, and the key itself (``key``) for machine-readable output."""

    key: str | None

    def __new__(cls, text: str, key: str | None = None) -> Problem:
        self = super().__new__(cls, text)
        self.key = key
        return self


class PeerKVConfigError(ValueError):
    """A tier configuration the library would refuse; ``problems`` lists
    each one (every message names its key)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("peerkv tier configuration: " + "; ".join(self.problems))


def tier_keys() -> list[str]:
    """Every key a peerkv ``secondary_tiers`` entry may hold."""
    return sorted({*_VLLM_KEYS, *_TIER_KEYS, *OPTIONS})


def _osa(a: str, b: str) -> int:
    """Optimal string alignment distance (Levenshtein plus adjacent swaps),
    as core/config.Suggest computes it."""
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def suggest(key: str, known: list[str] | None = None) -> str:
    """The known key closest to ``key``, or "" when none is close (the rule
    of core/config.Suggest: distance <= max(2, len/3), ties to the first in
    sorted order, compared in lower case with '-' read as '_')."""

    def norm(s: str) -> str:
        return s.lower().replace("-", "_")

    k = norm(key)
    best, best_d = "", -1
    for candidate in sorted(tier_keys() if known is None else known):
        d = _osa(k, norm(candidate))
        if best_d < 0 or d < best_d:
            best, best_d = candidate, d
    if best_d < 0 or best_d > max(2, len(k) // 3):
        return ""
    return best


def _unknown(key: str) -> Problem:
    close = suggest(key)
    if close:
        return Problem(f'unknown option "{key}" (did you mean "{close}"?)', key)
    return Problem(f'unknown option "{key}" (the options are listed in docs/vllm.md)', key)


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > 80:
        return f"a value of {len(text)} bytes"
    return text


def _valid(spec: dict[str, Any], value: Any) -> bool:
    kind = spec["type"]
    if kind == "any":
        return True
    if kind == "string":
        return isinstance(value, str) and (not spec.get("enum") or value in spec["enum"])
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        low, high = spec.get("min"), spec.get("max")
        return (low is None or value >= low) and (high is None or value <= high)
    if kind == "seconds":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return not math.isnan(value) and 0 < value <= SCHEMA["max_seconds"]
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string_list":
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    return False


def _type_problem(name: str, spec: dict[str, Any], value: Any) -> Problem | None:
    if value is None or _valid(spec, value):
        return None
    if spec.get("secret"):
        return Problem(f"{name} must be {spec['want']}", name)
    return Problem(f"{name} must be {spec['want']}, got {_shown(value)}", name)


def is_wildcard(host: str) -> bool:
    """Whether host binds every interface (so peers cannot dial it)."""
    return host.strip().strip("[]") in _WILDCARDS


_BITS = re.compile(r"0|[1-9][0-9]*")
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def _valid_host_name(name: str) -> bool:
    """core/config's validHostName: labels of letters, digits, '-' and '_'."""
    name = name[:-1] if name.endswith(".") else name
    if not name or len(name) > 253:
        return False
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return False
    return not labels[-1].isdigit()


def _peer_entry_problem(entry: str) -> str | None:
    """Why one allowed_peers entry is refused (core/config.PeerList.add)."""
    if "/" in entry:
        addr, _, bits = entry.partition("/")
        try:
            if not _BITS.fullmatch(bits) or "%" in addr:
                raise ValueError(entry)
            ip = ipaddress.ip_address(addr)
            if int(bits) > ip.max_prefixlen:
                raise ValueError(entry)
        except ValueError:
            return 'is not a CIDR (want an address/bits such as "10.0.0.0/8" or "fd00::/8")'
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            return "is an IPv4-mapped IPv6 prefix: write the IPv4 one"
        net = ipaddress.ip_network(entry, strict=False)
        if net.network_address != ip:
            return f"has bits set past its /{bits}: write {json.dumps(str(net))}"
        return None
    try:
        ip = ipaddress.ip_address(entry)
    except ValueError:
        ip = None
    if ip is not None:
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            return "has a zone: write the address alone"
        return None
    name = entry[2:] if entry.startswith("*.") else entry
    if not _valid_host_name(name):
        return 'is not a CIDR, an IP address or a host name (a wildcard name is written "*.example.svc")'
    return None


def allowed_peers_problem(entries: Any) -> str | None:
    """The first problem of an allowed_peers list, worded as the library
    words it, or None."""
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) for e in entries):
        return None  # the type check reports it
    if not entries:
        return (
            "allowed_peers is empty, which would refuse every peer: omit it to allow any peer, "
            'or list the peers\' networks (e.g. ["10.0.0.0/8", "fd00::/8"])'
        )
    for i, entry in enumerate(entries):
        why = _peer_entry_problem(entry)
        if why:
            return f"allowed_peers[{i}] {json.dumps(entry)} {why}"
    if all("/" not in e and _is_name(e) for e in entries):
        return (
            "allowed_peers lists no address: a peer's connection into this node (its answers to our dials, its "
            'own requests) is admitted by its source address, so list the peers\' networks too (e.g. ["10.0.0.0/8", "fd00::/8"])'
        )
    return None


def keep_warm_problem(config: Mapping[str, Any]) -> str | None:
    """The first problem of a keep_warm list, worded as the library words
    it (core/config checkKeepWarm), or None."""
    entries = config.get("keep_warm")
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) for e in entries):
        return None  # absent, or the type check reports it
    max_peers = config.get("max_peers", 128)
    if isinstance(max_peers, int) and max_peers > 0 and len(entries) > max_peers // 2:
        return f"keep_warm lists {len(entries)} peers, more than half of max_peers ({max_peers})"
    seen = set()
    for i, entry in enumerate(entries):
        host, sep, port = entry.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            host = ""  # an IPv6 address without brackets
        if not sep or not host:
            return (f'keep_warm[{i}] {json.dumps(entry)} is not "host:port" (an IPv6 address goes in brackets: '
                    '"[fd00::1]:5710")')
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            return f"keep_warm[{i}] {json.dumps(entry)}: port must be 1..65535"
        if is_wildcard(host):
            return f"keep_warm[{i}] {json.dumps(entry)} is a wildcard, not a peer's address"
        if not _allows_host(config.get("allowed_peers"), host):
            return (f"keep_warm[{i}] {json.dumps(entry)} is outside allowed_peers, so it would never be dialed: "
                    "add its address, network or name to allowed_peers, or drop it from keep_warm")
        if entry in seen:
            return f"keep_warm[{i}] {json.dumps(entry)} is listed twice"
        seen.add(entry)
    return None


def _allows_host(allowed: Any, host: str) -> bool:
    """Whether an allowed_peers list admits a peer named by host, as the
    library decides (core/config.PeerList.AllowsHost); an unset or invalid
    list (reported on its own) admits every host."""
    if not isinstance(allowed, (list, tuple)) or allowed_peers_problem(allowed) is not None:
        return True
    networks = [ipaddress.ip_network(e) for e in allowed if "/" in e or not _is_name(e)]
    if not _is_name(host):
        ip = ipaddress.ip_address(host)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip.version == net.version and ip in net for net in networks)
    name = host.lower().removesuffix(".")
    for entry in allowed:
        if entry.startswith("*."):
            if name.endswith("." + entry[2:].lower().removesuffix(".")):
                return True
        elif "/" not in entry and _is_name(entry) and entry.lower().removesuffix(".") == name:
            return True
    return False


def _is_name(entry: str) -> bool:
    try:
        ipaddress.ip_address(entry)
    except ValueError:
        return True
    return False


def is_loopback(host: str) -> bool:
    """Whether host names this machine's loopback (no other host reaches it)."""
    host = host.strip().strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_problem(key: str, host: str) -> Problem | None:
    """Whether this machine can bind host, as the engine will (an ephemeral
    port of it, closed at once); a Problem naming key when it cannot."""
    try:
        addresses = socket.getaddrinfo(host.strip("[]"), 0, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return Problem(
            f'{key} "{host}" does not resolve ({getattr(exc, "strerror", None) or exc}): '
            f"set {key} to this node's routable address",
            key,
        )
    why = ""
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(address)
                return None
        except OSError as exc:
            why = exc.strerror or str(exc)
    return Problem(
        f'{key} "{host}" is not an address of this machine, so the engine cannot bind it ({why}): '
        f"set {key} to this node's routable address (`hostname -I` lists them)",
        key,
    )


def _secret_problems(config: Mapping[str, Any], environ: Mapping[str, str], machine: bool) -> list[Problem]:
    """The library's secret rules (core/config.loadSecret, Validate), in its
    words; machine: read auth_secret_file as the engine will."""
    problems: list[Problem] = []
    given: list[str] = []
    if isinstance(config.get("auth_secret"), str) and config["auth_secret"]:
        given.append("auth_secret")
    path = config.get("auth_secret_file")
    if isinstance(path, str) and path:
        readable = True
        if machine:
            try:
                with open(path, "rb") as f:
                    secret = f.read().rstrip(b"\r\n")
            except OSError as exc:
                readable = False
                problems.append(Problem(
                    f'auth_secret_file "{path}" cannot be read ({exc.strerror}): put the cluster secret '
                    "there (one line, mode 0600, readable by the engine's user) or fix the path",
                    "auth_secret_file",
                ))
            else:
                if not secret:
                    readable = False
                    problems.append(Problem(f"auth_secret_file {path} is empty", "auth_secret_file"))
        if readable:
            given.append("auth_secret_file")
    if environ.get(SECRET_ENV):
        given.append(SECRET_ENV)
    if len(given) > 1:
        problems.append(Problem(
            f"the auth secret is given more than once (auth_secret, auth_secret_file, {SECRET_ENV}): keep one",
            given[0],
        ))
    if config.get("encrypt") is True and not given and not problems:
        problems.append(Problem(
            f"encrypt needs a cluster secret: set auth_secret_file or {SECRET_ENV}", "encrypt"
        ))
    return problems


def _env_problems(config: Mapping[str, Any], environ: Mapping[str, str]) -> list[Problem]:
    """vLLM's p2p environment variables, read as the engine reads them."""
    problems: list[Problem] = []
    for var, (option, parse) in _P2P_ENV.items():
        text = environ.get(var)
        if text is None:
            continue
        try:
            value = parse(text)
        except ValueError:
            kind = "an integer" if parse is int else "a number"
            problems.append(Problem(
                f"environment: {var} must be {kind} (vLLM reads it so), got {_shown(text)}: fix or unset it", var
            ))
            continue
        if config.get(option) is not None:
            continue  # the tier's own value wins
        if option == "idle_timeout_s" and value <= 0:
            continue  # turns idle eviction off
        spec = OPTIONS[option]
        if not _valid(spec, value):
            problems.append(Problem(
                f"environment: {var}={text.strip()} is out of range: {option} must be {spec['want']}; "
                f'fix or unset it, or set "{option}" in the tier',
                var,
            ))
    return problems


def _data_port_problems(config: Mapping[str, Any], environ: Mapping[str, str]) -> list[Problem]:
    """The default data port, port + DATA_PORT_OFFSET (core/config), must be
    a port: the library refuses it otherwise, so say so before the engine."""
    if config.get("data_port") is not None:
        return []
    port = config.get("port")
    if port is None:
        try:
            port = int(environ.get("VLLM_P2P_SIDE_CHANNEL_PORT", ""))
        except ValueError:
            return []  # unset (vLLM's default is low enough) or reported by _env_problems
    if isinstance(port, bool) or not isinstance(port, int) or port + DATA_PORT_OFFSET <= 65535:
        return []
    return [Problem(
        f"data_port defaults to port + {DATA_PORT_OFFSET} = {port + DATA_PORT_OFFSET}, above 65535: "
        "set data_port (0: an ephemeral port) or a lower port",
        "data_port",
    )]


def problems_in(
    config: Mapping[str, Any], environ: Mapping[str, str] | None = None, *, machine: bool = False
) -> list[str]:
    """Every problem of a peerkv tier configuration, in key order, then the
    environment's; machine: also what only this machine can tell (the
    addresses it can bind, the secret file it can read)."""
    environ = os.environ if environ is None else environ
    problems: list[str] = []
    for key in sorted(config):
        value = config[key]
        spec = _VLLM_KEYS.get(key) or _TIER_KEYS.get(key) or OPTIONS.get(key)
        if spec is None:
            problems.append(_unknown(key))
            continue
        problem = _type_problem(key, spec, value)
        if problem:
            problems.append(problem)
    peers_problem = allowed_peers_problem(config.get("allowed_peers"))
    if peers_problem:
        problems.append(peers_problem)
    warm_problem = keep_warm_problem(config)
    if warm_problem:
        problems.append(Problem(warm_problem, "keep_warm"))
    if config.get("backpressure") is not None:
        problems.append(Problem(
            "backpressure is not supported by peerkv: dropping a PD store leaves the decoder "
            "waiting for its load deadline; remove it from this tier",
            "backpressure",
        ))
    for alias, spec in _TIER_KEYS.items():
        target = spec.get("alias_of")
        if target and config.get(alias) is not None and config.get(target) is not None:
            problems.append(Problem(f"{alias} and {target} name the same option: keep one", alias))
    host = config.get("host")
    if host is None:
        host = environ.get("VLLM_P2P_SIDE_CHANNEL_HOST")
    advertise = config.get("advertise_host")
    if isinstance(advertise, str) and is_wildcard(advertise):
        problems.append(Problem(
            f'advertise_host "{advertise}" is a wildcard: set the address peers dial to reach this node',
            "advertise_host",
        ))
    elif isinstance(host, str) and is_wildcard(host) and not advertise:
        problems.append(Problem(
            f'host "{host}" binds every interface, so it cannot be the identity peers dial: '
            'set advertise_host to this node\'s routable address (e.g. "10.0.0.1"), or set host to it',
            "host",
        ))
    problems.extend(_secret_problems(config, environ, machine))
    problems.extend(_env_problems(config, environ))
    problems.extend(_data_port_problems(config, environ))
    if machine:
        for key, value in (("host", host if host is not None else "localhost"), ("data_host", config.get("data_host"))):
            if isinstance(value, str) and value and not is_wildcard(value):
                problem = bind_problem(key, value)
                if problem is not None:
                    problems.append(problem)
    return problems


def check_tier_config(
    config: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    *,
    machine: bool = False,
    multi_host: bool = False,
) -> list[str]:
    """Raises PeerKVConfigError listing every problem; returns warnings
    (lines worth logging, e.g. a secret given inline). machine: also check
    what only the engine's machine can tell (problems_in); multi_host: warn
    when the identity peers dial is a loopback address."""
    if not isinstance(config, Mapping):
        raise PeerKVConfigError([f"a secondary_tiers entry must be a JSON object, got {_shown(config)}"])
    environ = os.environ if environ is None else environ
    problems = problems_in(config, environ, machine=machine)
    if problems:
        raise PeerKVConfigError(problems)
    warnings: list[str] = []
    if config.get("auth_secret"):
        warnings.append(Problem(
            "auth_secret is given inline, so it shows in the process list and in vLLM's "
            "logged arguments: put it in a file (auth_secret_file, mode 0600) or in $PEERKV_AUTH_SECRET",
            "auth_secret",
        ))
    if multi_host:
        key = "advertise_host" if config.get("advertise_host") else "host"
        identity = config.get(key) or environ.get("VLLM_P2P_SIDE_CHANNEL_HOST") or "localhost"
        if is_loopback(identity):
            warnings.append(Problem(
                f'{key} "{identity}" is a loopback address, the identity peers dial: engines on other '
                f"hosts can never reach this one; set {key} to this node's routable address",
                key,
            ))
    return warnings


def library_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The library options of a checked configuration: vLLM's and the tier's
    own keys removed, aliases renamed, unset (None) values dropped."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if value is None or key in _VLLM_KEYS:
            continue
        spec = _TIER_KEYS.get(key)
        if spec is not None:
            if spec.get("alias_of"):
                out[spec["alias_of"]] = list(value) if isinstance(value, tuple) else value
            continue
        out[key] = value
    return out
