"""Independent oracle for peerkv's wire codec (driven by oracle_test.go).

Reads one JSON document from stdin:
  {"accept": [{"name", "dict", "go_hex"}], "reject": [{"name", "go_hex"}]}
where "dict" is vLLM's message dict with ordered maps written as
{"$map": [[key, value], ...]} and bytes as {"$bin": "<hex>"}.

For every accepted vector it encodes the dict with msgspec (as vLLM's ZMQ
transport does), decodes Go's bytes with msgspec, compares type-strictly,
and runs vLLM's own XxxMsg.validate on the decoded dict. For every rejected
vector it reports how vLLM would treat the frame. Writes one JSON document
to stdout.
"""

import importlib.util
import json
import os
import sys

import msgspec


def load_vllm_protocol():
    # protocol.py has no imports; loading the file directly avoids importing
    # the vllm package (torch etc.), which takes seconds.
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vllm is not installed in this interpreter")
    path = os.path.join(spec.submodule_search_locations[0],
                        "v1", "kv_offload", "tiering", "p2p", "session", "protocol.py")
    mod_spec = importlib.util.spec_from_file_location("vllm_p2p_protocol", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod, path


def from_json(v):
    if isinstance(v, dict):
        if "$bin" in v:
            return bytes.fromhex(v["$bin"])
        if "$map" in v:
            return {from_json(k): from_json(x) for k, x in v["$map"]}
        raise ValueError(f"untagged object {v!r}")
    if isinstance(v, list):
        return [from_json(x) for x in v]
    return v


def same(a, b):
    """Equality that also requires identical Python types (True != 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a.keys()) == list(b.keys()) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def main():
    proto, path = load_vllm_protocol()
    validators = {
        cls.TYPE: getattr(cls, "validate", None)
        for cls in (proto.ConnectMsg, proto.ConnectAckMsg, proto.DisconnectMsg, proto.FetchMsg,
                    proto.LookupMsg, proto.LookupRespMsg, proto.TransferDoneMsg,
                    proto.AbortFetchMsg, proto.AbortAckMsg)
    }
    req = json.load(sys.stdin)
    out = {"protocol_py": path, "msgspec": msgspec.__version__, "accept": [], "reject": []}
    for vec in req["accept"]:
        want = from_json(vec["dict"])
        res = {"name": vec["name"], "msgspec_hex": msgspec.msgpack.encode(want).hex()}
        try:
            got = msgspec.msgpack.decode(bytes.fromhex(vec["go_hex"]))
            res["decoded_equal"] = same(want, got)
            res["decoded_repr"] = repr(got)[:400]
            validate = validators.get(got.get(proto.TYPE_KEY), None)
            if validate is not None:
                validate(got)
            res["validate"] = "ok"
        except Exception as exc:  # reported, judged by the Go test
            res["validate"] = f"{type(exc).__name__}: {exc}"
        out["accept"].append(res)
    for vec in req["reject"]:
        res = {"name": vec["name"]}
        try:
            got = msgspec.msgpack.decode(bytes.fromhex(vec["go_hex"]))
        except msgspec.DecodeError as exc:
            res["verdict"] = f"undecodable: {exc}"
            out["reject"].append(res)
            continue
        msg_type = got.get(proto.TYPE_KEY) if isinstance(got, dict) else None
        if msg_type not in validators:
            res["verdict"] = "ignored"
        elif validators[msg_type] is None:
            res["verdict"] = "accepted"
        else:
            try:
                validators[msg_type](got)
                res["verdict"] = "accepted"
            except ValueError as exc:
                res["verdict"] = f"rejected: {exc}"
        out["reject"].append(res)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
