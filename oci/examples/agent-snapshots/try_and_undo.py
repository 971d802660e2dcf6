"""An agent's try-and-undo loop on a ParaCell snapshot-mode sandbox, through
the Python SDK (paracell.sandbox, docs/sdk.md): no `paracell` process per
command.

Run as root from the repository, after `make demo` has built the guest:

    .venv/bin/python oci/examples/agent-snapshots/try_and_undo.py

It creates a sandbox from the hello example's rootfs in snapshot mode,
checkpoints it, lets three "tool calls" change its files, rolls back after
each failed one, forks two sandboxes from the good state, and removes
everything it made.
"""

import json
import shutil
import tempfile
from pathlib import Path

from paracell.sandbox import Sandbox

HERE = Path(__file__).resolve().parent


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="paracell-agent-"))
    bundle = work / "bundle"
    shutil.copytree(HERE.parent / "hello" / "rootfs", bundle / "rootfs", symlinks=True)
    config = json.loads((HERE.parent / "hello" / "config.json").read_text())
    config["process"]["args"] = ["sleep", "3600"]
    config["root"] = {"path": "rootfs", "readonly": False}
    (bundle / "config.json").write_text(json.dumps(config))

    def sh(box: Sandbox, script: str) -> str:
        return box.run(["sh", "-c", script], timeout=60).stdout.decode().strip()

    try:
        with Sandbox.create(str(bundle), "agent", root=str(work / "state"),
                            snapshot=True) as box:
            box.files.write("/work.py", b"def answer(): return 41\n")
            done = box.checkpoint("good")
            print(f"checkpoint {done['name']}: paused {done['paused_s'] * 1000:.1f} ms, "
                  f"{done['bytes'] >> 20} MiB saved")
            attempts = ("rm -rf /etc", "echo broken > /work.py",
                        "dd if=/dev/zero of=/big bs=1M count=8")
            for attempt in attempts:
                sh(box, attempt)
                print(f"tried {attempt!r}: /work.py is {box.files.read('/work.py')!r}; "
                      "rolling back")
                done = box.rollback("good")
                print(f"  rolled back in {done['total_s'] * 1000:.1f} ms: /work.py is "
                      f"{box.files.read('/work.py')!r}, "
                      f"/etc has {len(box.files.list('/etc'))} entries")
            for fork in box.fork("good", count=2):
                try:
                    print(f"fork {fork.id}: hostname {sh(fork, 'hostname')}, "
                          f"/work.py {fork.files.read('/work.py')!r}")
                finally:
                    fork.kill()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
