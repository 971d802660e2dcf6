"""An agent's try-and-undo loop on a ParaCell snapshot-mode sandbox, through
the Python API (paracell.sandbox, docs/snapshots.md).

Run as root from the repository, after `make demo` has built the guest:

    .venv/bin/python oci/examples/agent-snapshots/try_and_undo.py

It creates a sandbox from the hello example's rootfs with
io.paracell.snapshot: "on", checkpoints it, lets three "tool calls" change
its files, rolls back after each failed one, forks two sandboxes from the
good state, and removes everything it made.
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from paracell.sandbox import Sandbox

HERE = Path(__file__).resolve().parent
PARACELL = str(Path(sys.executable).with_name("paracell"))


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="paracell-agent-"))
    root = str(work / "state")
    cli = [PARACELL, "--root", root]
    bundle = work / "bundle"
    shutil.copytree(HERE.parent / "hello" / "rootfs", bundle / "rootfs", symlinks=True)
    config = json.loads((HERE.parent / "hello" / "config.json").read_text())
    config["process"]["args"] = ["sleep", "3600"]
    config["root"] = {"path": "rootfs", "readonly": False}
    config["annotations"] = {"io.paracell.snapshot": "on"}
    (bundle / "config.json").write_text(json.dumps(config))

    def sh(cid: str, script: str) -> str:
        done = subprocess.run([*cli, "exec", cid, "sh", "-c", script], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        return done.stdout.strip()

    subprocess.run([*cli, "run", "--detach", "--bundle", str(bundle), "agent"], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    box = Sandbox("agent", root=root)
    forks: list[str] = []
    try:
        sh("agent", "echo 'def answer(): return 41' > /work.py")
        done = box.checkpoint("good")
        print(f"checkpoint {done['name']}: paused {done['paused_s'] * 1000:.1f} ms, "
              f"{done['bytes'] >> 20} MiB saved")
        attempts = ("rm -rf /etc", "echo broken > /work.py",
                    "dd if=/dev/zero of=/big bs=1M count=8")
        for attempt in attempts:
            sh("agent", attempt)
            print(f"tried {attempt!r}: /work.py is {sh('agent', 'cat /work.py')!r}; rolling back")
            done = box.rollback("good")
            print(f"  rolled back in {done['total_s'] * 1000:.1f} ms: /work.py is "
                  f"{sh('agent', 'cat /work.py')!r}, "
                  f"/etc has {sh('agent', 'ls /etc | wc -l')} entries")
        forks = box.fork("good", count=2)
        for fid in forks:
            print(f"fork {fid}: hostname {sh(fid, 'hostname')}, "
                  f"/work.py {sh(fid, 'cat /work.py')!r}")
    finally:
        for cid in ["agent", *forks]:
            subprocess.run([*cli, "delete", "--force", cid], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
