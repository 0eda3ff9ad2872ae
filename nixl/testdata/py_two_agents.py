"""Feasibility probe (docs/nixl.md, "Troubleshooting"): two plain Python nixl agents in
two processes, DRAM WRITE from the initiator's buffer into the target's.

  python py_two_agents.py target DIR &  python py_two_agents.py initiator DIR

Metadata and the target's buffer address travel through files in DIR.
Exit status 0 on both sides means the bytes arrived intact.
"""

import ctypes
import os
import pathlib
import sys
import time

os.environ.setdefault("UCX_HANDLE_ERRORS", "none")

from nixl._api import nixl_agent, nixl_agent_config  # noqa: E402

ROWS, ROW_LEN = 8, 4096


def wait_file(path: pathlib.Path, timeout: float = 60) -> bytes:
    deadline = time.time() + timeout
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(path)
        time.sleep(0.05)
    return path.read_bytes()


def main() -> int:
    role, workdir = sys.argv[1], pathlib.Path(sys.argv[2])
    buf = bytearray(ROWS * ROW_LEN)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    agent = nixl_agent(f"{role}-{os.getpid()}", nixl_agent_config(backends=["UCX"]))
    agent.register_memory([(addr, len(buf), 0, "")], "DRAM")
    want = bytes((i * 7 + 3) % 251 for i in range(len(buf)))
    if role == "target":
        tmp = workdir / "target.md.tmp"
        (workdir / "target.addr").write_text(str(addr))
        tmp.write_bytes(agent.get_agent_metadata())
        tmp.rename(workdir / "target.md")
        wait_file(workdir / "initiator.done")
        print("target: bytes match:", bytes(buf) == want, flush=True)
        return 0 if bytes(buf) == want else 1
    buf[:] = want
    md = wait_file(workdir / "target.md")
    remote_addr = int((workdir / "target.addr").read_text())
    name = agent.add_remote_agent(md)
    descs = lambda base: [(base + i * ROW_LEN, ROW_LEN, 0) for i in range(ROWS)]  # noqa: E731
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", descs(addr), "DRAM")
    remote = agent.prep_xfer_dlist(name, descs(remote_addr), "DRAM")
    handle = agent.make_prepped_xfer("WRITE", local, list(range(ROWS)), remote, list(range(ROWS)))
    state = agent.transfer(handle)
    deadline = time.time() + 20
    while state not in ("DONE", "ERR") and time.time() < deadline:
        time.sleep(0.001)
        state = agent.check_xfer_state(handle)
    print("initiator: state", state, flush=True)
    (workdir / "initiator.done").write_text(state)
    return 0 if state == "DONE" else 1


if __name__ == "__main__":
    sys.exit(main())
