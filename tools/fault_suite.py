"""Break run directories on purpose and check that nothing computed is lost or done twice.

    python tools/fault_suite.py            # everything: 20 kill -9, every database file and WAL, ...
    python tools/fault_suite.py --fast     # the part CI runs (tests/test_fault_suite.py)

Faults: kill -9 at random moments of a ``-k 2`` search, each followed by ``resume``; truncation (to half),
emptying and deletion of each database file and of its WAL in a run killed mid-search; a corrupted run.json;
two writers at once; a full disk (RLIMIT_FSIZE); a read-only run directory (where it can be made); bad budgets.
After each, the user's way out is taken: ``resume``, or, when that stops with a clear message, ``recover`` and
``resume``. A fault is survived when the run then finishes with every attempt recorded before the fault and
no attempt evaluated twice. A fault that destroys store.sqlite itself (the only full record of the attempts'
code) cannot be survived: it must stop with a clear message, and ``recover --start-over`` must make the run
directory usable again; its attempts count as lost. One line per fault, then: faults survived / tried, attempts lost, attempts repeated.
Offline planner on examples/softmax (CPU, no LLM key).
"""

from __future__ import annotations

import argparse
from contextlib import closing
import fcntl
import json
import os
import random
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "examples" / "softmax"
BUDGET = 6
SEARCH = ["--iterations", str(BUDGET), "-k", "2", "--stagnation-window", "2", "--quiet"]


@dataclass
class Outcome:
    fault: str
    how: str  # survived | recovered | restarted (the store itself destroyed: started over) | FAILED
    lost: int = 0
    repeated: int = 0
    note: str = ""

    @property
    def survived(self) -> bool:
        return self.how in ("survived", "recovered") and self.lost == 0 and self.repeated == 0

    def line(self) -> str:
        figures = f"lost {self.lost}, repeated {self.repeated}" if self.how != "FAILED" else ""
        return f"{self.fault:<44} {self.how:<10} {figures:<22} {self.note}"


def ksearch(*args: str, timeout: float = 900, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    def small_disk():  # in the child: a file-size limit stands in for a full disk (EFBIG instead of a kill)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "ksearch_graph.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=small_disk if limit_bytes else None,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ksearch_graph.cli", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def attempts(run: Path) -> list[str]:
    # Connections are closed at once: one left open across a fault (a WAL deleted beneath it) would, on closing
    # later, checkpoint through its stale index into store.sqlite and damage it; no ksearch reader stays open so.
    try:
        with closing(sqlite3.connect(f"file:{run / 'store.sqlite'}?mode=ro", uri=True, timeout=30)) as db:
            return [r[0] for r in db.execute("select id from attempts where prompt_kind != 'seed' order by iteration")]
    except sqlite3.Error:
        return []


def verify(run: Path, before: set[str]) -> tuple[int, int, str]:
    """(attempts lost, attempts repeated, problem) of a run that should now be finished."""
    with closing(sqlite3.connect(run / "store.sqlite")) as db:
        ids = [r[0] for r in db.execute("select id from attempts where prompt_kind != 'seed'")]
        events = [json.loads(r[0])["attempt_id"] for r in db.execute("select data from events where kind='attempt'")]
        status = json.loads(db.execute("select value from meta where key='status'").fetchone()[0])
    lost = len(before - set(ids))
    again = sum(events.count(i) - 1 for i in set(events) if events.count(i) > 1)
    repeated = again + max(0, len(ids) - BUDGET)  # beyond the budget: cycles started again
    problem = "" if status == "finished" else f"status {status}"
    return lost, repeated, problem


def clear_stop(proc: subprocess.CompletedProcess) -> bool:
    return proc.returncode in (2, 74) and "Traceback" not in proc.stderr and proc.stderr.strip() != ""


def way_out(fault: str, run: Path, before: set[str], first: subprocess.CompletedProcess | None = None) -> Outcome:
    """What a user does after a fault: resume; if that stops clearly, recover and resume."""
    proc = first or ksearch("resume", str(run), "--quiet")
    how, note = "survived", ""
    if proc.returncode != 0:
        if not clear_stop(proc):
            return Outcome(fault, "FAILED", note=f"resume exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        note = proc.stderr.strip().splitlines()[0][:110]
        fixed = ksearch("recover", str(run))
        if fixed.returncode != 0 and clear_stop(fixed) and "--start-over" in fixed.stderr:
            fixed = ksearch("recover", str(run), "--start-over")
            how = "restarted"
        if fixed.returncode != 0:
            return Outcome(fault, "FAILED", note=f"recover exited {fixed.returncode}: {fixed.stderr.strip()[-300:]}")
        proc = ksearch("resume", str(run), "--quiet")
        if proc.returncode != 0:
            return Outcome(fault, "FAILED", note=f"resume after recover exited {proc.returncode}: "
                                                 f"{proc.stderr.strip()[-300:]}")
        how = "restarted" if how == "restarted" else "recovered"
    try:
        lost, repeated, problem = verify(run, before)
    except sqlite3.Error as e:
        return Outcome(fault, "FAILED", note=f"store.sqlite unreadable after the run finished: {e}")
    if how == "restarted":
        lost = len(before)  # recorded in the destroyed store; a new attempt may reuse an old id
    return Outcome(fault, "FAILED" if problem else how, lost, repeated, problem or note)


# ---------------------------------------------------------------------------------------------------- faults


def kills(work: Path, count: int, rng: random.Random) -> list[Outcome]:
    """One search killed with SIGKILL ``count`` times at random moments, resumed after each kill."""
    run = work / "killed"
    args = ["run", str(TASK), "--run-dir", str(run), *SEARCH]
    seen: list[tuple[str, set[str]]] = []
    for i in range(count):
        proc = start(*args)
        moment = rng.uniform(3.0, 30.0)
        try:
            proc.wait(timeout=moment)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        if proc.returncode == 0:
            break  # finished before the kill
        seen.append((f"kill -9 #{i + 1} at {moment:.1f} s", set(attempts(run))))
        if (run / "run.json").exists():
            args = ["resume", str(run), "--quiet"]
    final = ksearch(*args)
    out = []
    for fault, before in seen:
        if final.returncode != 0:
            out.append(Outcome(fault, "FAILED", note=f"final resume exited {final.returncode}: {final.stderr[-300:]}"))
            continue
        lost, repeated, problem = verify(run, before)
        out.append(Outcome(fault, "FAILED" if problem else "survived", lost, repeated,
                           problem or f"{len(before)} attempts on disk"))
    return out


def killed_mid_search(work: Path) -> Path:
    """A run killed with SIGKILL once it has evaluated a few attempts: its WAL files are still there."""
    run = work / "mid"
    proc = start("run", str(TASK), "--run-dir", str(run), *SEARCH)
    deadline = time.time() + 600
    while len(attempts(run)) < 3:
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("the search ended before it could be killed mid-way")
        time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return run


def database_faults(work: Path, base: Path, names: list[str]) -> list[Outcome]:
    out = []
    for name in names:
        for damage in ("truncated", "emptied", "deleted"):
            run = work / f"{name}-{damage}"
            shutil.copytree(base, run)
            before = set(attempts(run))
            path = run / name
            if not path.exists():
                out.append(Outcome(f"{name} {damage}", "survived", note="(no such file at the kill)"))
                continue
            if damage == "truncated":
                os.truncate(path, path.stat().st_size // 2)
            elif damage == "emptied":
                os.truncate(path, 0)
            else:
                path.unlink()
            out.append(way_out(f"{name} {damage}", run, before))
    return out


def corrupted_run_json(work: Path, base: Path) -> Outcome:
    run = work / "run-json"
    shutil.copytree(base, run)
    (run / "run.json").write_text('{"format": 1, "thread_id": "x", "config": {"budget": {"iterations": -5')
    return way_out("run.json corrupted", run, set(attempts(run)))


def two_writers(work: Path, base: Path) -> Outcome:
    run = work / "two-writers"
    shutil.copytree(base, run)
    before = set(attempts(run))
    first = start("resume", str(run), "--quiet")
    deadline = time.time() + 60
    while not lock_held(run) and time.time() < deadline:
        time.sleep(0.1)
    second = ksearch("resume", str(run), "--quiet")
    reader = ksearch("show", str(run), "--json")  # readers work during a run
    first.wait(timeout=900)
    if reader.returncode != 0:
        return Outcome("two writers at once", "FAILED", note=f"show during the run exited {reader.returncode}: "
                                                                f"{reader.stderr.strip()[-200:]}")
    if second.returncode != 2 or "another process" not in second.stderr:
        return Outcome("two writers at once", "FAILED", note=f"second writer exited {second.returncode}: "
                                                                f"{second.stderr.strip()[-200:]}")
    if first.returncode != 0:
        return Outcome("two writers at once", "FAILED", note=f"first writer exited {first.returncode}")
    lost, repeated, problem = verify(run, before)
    return Outcome("two writers at once", "FAILED" if problem else "survived", lost, repeated,
                   problem or "second refused: " + second.stderr.strip().split(" (")[0][-60:])


def lock_held(run: Path) -> bool:
    try:
        with open(run / "writer.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True


def after_stop(out: Outcome, stop: subprocess.CompletedProcess, done: str) -> Outcome:
    """``out`` (the way out after a run stopped clearly) with the stop in its note; a failure keeps its reason."""
    said = f"exit 74 ({stop.stderr.strip()[9:80]}...)"
    out.note = f"{said}, then: {out.note}" if out.how == "FAILED" else f"{said}, then {done}"
    return out


def disk_full(work: Path, base: Path) -> Outcome:
    run = work / "disk-full"
    shutil.copytree(base, run)
    before = set(attempts(run))
    # Room for 64 KiB more than the largest database holds now: the remaining attempts need more, whether SQLite
    # appends to a WAL (already longer than that: its next frame fails) or restarts it after a checkpoint.
    biggest = max((run / name).stat().st_size for name in ("store.sqlite", "checkpoints.sqlite"))
    proc = ksearch("resume", str(run), "--quiet", limit_bytes=biggest + 65536)
    if proc.returncode == 0:
        return Outcome("disk full (RLIMIT_FSIZE)", "FAILED", note="the search never hit the limit")
    if proc.returncode != 74 or "disk is full" not in proc.stderr or "Traceback" in proc.stderr:
        return Outcome("disk full (RLIMIT_FSIZE)", "FAILED", note=f"exit {proc.returncode}: {proc.stderr[-300:]}")
    return after_stop(way_out("disk full (RLIMIT_FSIZE)", run, before), proc, "resumed")  # space is back


def read_only(work: Path, base: Path) -> Outcome:
    """A read-only run directory: a read-only bind mount of it as root, else its files made read-only (chmod)."""
    run = work / "read-only"
    shutil.copytree(base, run)
    before = set(attempts(run))

    def mount(*args: str) -> bool:
        return subprocess.run(["mount", *args], capture_output=True).returncode == 0

    as_root = os.geteuid() == 0
    if as_root:
        if not mount("--bind", str(run), str(run)):
            return Outcome("read-only run directory", "skipped", note="(root without mount: cannot make one)")
        if not mount("-o", "remount,bind,ro", str(run)):
            subprocess.run(["umount", str(run)], capture_output=True)
            return Outcome("read-only run directory", "skipped", note="(the bind mount cannot be made read-only)")
    else:
        for p in [run, *run.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
    try:
        proc = ksearch("resume", str(run), "--quiet")
    finally:
        if as_root:
            subprocess.run(["umount", str(run)], capture_output=True)
        else:
            for p in [run, *run.rglob("*")]:
                p.chmod(p.stat().st_mode | 0o200)
    if not (proc.returncode == 74 and "read-only" in proc.stderr and "Traceback" not in proc.stderr):
        return Outcome("read-only run directory", "FAILED", note=f"exit {proc.returncode}: {proc.stderr[-300:]}")
    return after_stop(way_out("read-only run directory", run, before), proc, "resumed writable")


def bad_budgets(work: Path, base: Path) -> list[Outcome]:
    run = work / "budgets"
    shutil.copytree(base, run)
    done = len(attempts(run))
    manifest = (run / "run.json").read_bytes()
    cases = [("resume --iterations -5", ["resume", str(run), "--iterations", "-5"]),
             ("resume --iterations 0", ["resume", str(run), "--iterations", "0"]),
             ("resume --iterations abc", ["resume", str(run), "--iterations", "abc"]),
             (f"resume --iterations {max(done - 1, 1)} (< {done} done)",
              ["resume", str(run), "--iterations", str(max(done - 1, 1))]),
             ("resume --more 0", ["resume", str(run), "--more", "0"]),
             ("run --iterations -1", ["run", str(TASK), "--run-dir", str(work / "never"), "--iterations", "-1"]),
             ("run -k 0", ["run", str(TASK), "--run-dir", str(work / "never"), "-k", "0"]),
             ("run --max-cost -1", ["run", str(TASK), "--run-dir", str(work / "never"), "--max-cost", "-1"])]
    out = []
    for fault, args in cases:
        proc = ksearch(*args)
        unchanged = (run / "run.json").read_bytes() == manifest and not (work / "never").exists()
        ok = proc.returncode == 2 and "Traceback" not in proc.stderr and unchanged
        note = proc.stderr.strip().splitlines()[-1][:100] if proc.stderr.strip() else ""
        out.append(Outcome(f"bad budget: {fault}", "survived" if ok else "FAILED",
                           note=note if ok else f"exit {proc.returncode}, run.json unchanged: {unchanged}; {note}"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="the CI part: fewer kills, the checkpoint file only")
    parser.add_argument("--kills", type=int, help="kill -9 moments (default 20, 2 with --fast)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(args.keep or tempfile.mkdtemp(prefix="ksearch-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    names = ["checkpoints.sqlite"] if args.fast else \
        ["checkpoints.sqlite", "checkpoints.sqlite-wal", "store.sqlite", "store.sqlite-wal"]
    print(f"{'fault':<44} {'outcome':<10} {'figures':<22} note", flush=True)
    outcomes: list[Outcome] = []

    def report(items: list[Outcome] | Outcome) -> None:
        for o in items if isinstance(items, list) else [items]:
            outcomes.append(o)
            print(o.line(), flush=True)

    try:
        report(kills(work, args.kills if args.kills is not None else (2 if args.fast else 20), rng))
        base = killed_mid_search(work)
        report(database_faults(work, base, names))
        report(corrupted_run_json(work, base))
        report(two_writers(work, base))
        report(disk_full(work, base))
        if not args.fast:
            report(read_only(work, base))
        report(bad_budgets(work, base))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    tried = [o for o in outcomes if o.how != "skipped"]
    survived = sum(o.survived for o in tried)
    restarted = [o for o in tried if o.how == "restarted" and o.repeated == 0]
    print(f"\nfaults survived: {survived}/{len(tried)} ({sum(o.how == 'recovered' for o in tried)} of them stopped "
          f"with a clear message and were recovered; {len(restarted)} more destroyed store.sqlite itself, stopped "
          f"with a clear message and were started over with recover --start-over)   attempts lost: "
          f"{sum(o.lost for o in tried)} ({sum(o.lost for o in restarted)} of them in a destroyed store)   "
          f"attempts repeated: {sum(o.repeated for o in tried)}")
    return 0 if survived + len(restarted) == len(tried) else 1


if __name__ == "__main__":
    sys.exit(main())
