"""Break run directories and the evaluation infrastructure on purpose; check that nothing computed is lost or done
twice, that budgets hold, and that nothing is spent on a failure the candidate did not cause.

    python tools/fault_suite.py            # everything: 20 kill -9, every database file and WAL, Ray, ...
    python tools/fault_suite.py --fast     # the part CI runs (tests/test_fault_suite.py)

Faults: kill -9 at random moments of a ``-k 2`` search, each followed by ``resume``; truncation (to half),
emptying and deletion of each database file and of its WAL in a run killed mid-search; a corrupted run.json;
two writers at once; a full disk (RLIMIT_FSIZE) and a disk that stays full (a full tmpfs as root, else a file-size
limit of 0) while resume, recover and the readers run; a read-only run directory (where it can be made); bad budgets;
budgets after kill -9, Ctrl-C, a full disk and a branch at an attempt (a cycle in progress launched with a 12
iteration allowance); the readers (show, history, report) on damaged, emptied and deleted databases; a task whose
reference does not compile; a host that cannot make the candidates' sandbox; judges killed on the local pool (the
infrastructure down, then two deaths in one attempt); on Ray (where installed), a cluster whose workers lack the
package, one whose workers cannot make the sandbox, and a worker lost twice.
After each, the user's way out is taken: ``resume``, or, when that stops with a clear message, ``recover`` and
``resume``. A fault is survived when the run then finishes with every attempt recorded before the fault and
no attempt evaluated twice; a refusal (a broken task, a pool that cannot run it, a reader on a damaged file) counts
as stopped with correct advice when it exits non-zero with the right advice and has written nothing. A fault that
destroys store.sqlite itself (the only full record of the attempts' code) cannot be survived: it must stop with a
clear message, and ``recover --start-over`` must make the run directory usable again; its attempts count as lost.
One line per fault, then: faults survived or stopped / tried, attempts lost, attempts repeated, the largest ratio of
iterations run to the budget set, and the LLM calls (the ledger's coder and planner rows) or attempts spent on
infrastructure failures. Offline planner on examples/softmax (CPU, no LLM key).
"""

from __future__ import annotations

import argparse
import contextlib
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
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's ksearch_graph, as the ksearch commands below use
TASK = REPO / "examples" / "softmax"
BUDGET = 6
SEARCH = ["--iterations", str(BUDGET), "-k", "2", "--stagnation-window", "2", "--quiet"]


@dataclass
class Outcome:
    fault: str
    # survived | recovered | stopped (refused with the right advice, nothing written) | restarted (the store itself
    # destroyed: started over) | skipped | FAILED
    how: str
    lost: int = 0
    repeated: int = 0
    note: str = ""
    ratio: float | None = None  # iterations run / the budget set, where the fault is about a budget
    spent: int | None = None  # LLM calls or attempts spent on infrastructure failures, where it is about those

    @property
    def survived(self) -> bool:
        return self.how in ("survived", "recovered", "stopped") and self.lost == 0 and self.repeated == 0 \
            and (self.ratio is None or self.ratio <= 1.0) and not self.spent

    def line(self) -> str:
        figures = f"lost {self.lost}, repeated {self.repeated}" if self.how != "FAILED" else ""
        if self.ratio is not None:
            figures += f", {self.ratio:.2f} of budget"
        if self.spent is not None:
            figures += f", {self.spent} spent on infra"
        return f"{self.fault:<50} {self.how:<10} {figures:<46} {self.note}"


def ksearch(*args: str, timeout: float = 900, limit_bytes: int | None = None, env: dict | None = None,
            cwd: Path = REPO) -> subprocess.CompletedProcess:
    def small_disk():  # in the child: a file-size limit stands in for a full disk (EFBIG instead of a kill)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "ksearch_graph.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=small_disk if limit_bytes is not None else None,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def start(*args: str, output: bool = False, env: dict | None = None) -> subprocess.Popen:
    pipe = subprocess.PIPE if output else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "ksearch_graph.cli.main", *args], cwd=REPO, stdout=pipe, stderr=pipe,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def attempts(run: Path) -> list[str]:
    # Read as ksearch's readers read (sqlite_snapshot.py): nothing is created or changed beside the store, and no
    # connection stays open across a fault (one would checkpoint through a stale index into store.sqlite later).
    from ksearch_graph.rundir.sqlite_snapshot import open_read_only

    try:
        with closing(open_read_only(run / "store.sqlite")) as db:
            return [r[0] for r in db.execute("select id from attempts where prompt_kind != 'seed' order by iteration")]
    except Exception:  # missing, empty, damaged: none readable
        return []


def verify(run: Path, before: set[str]) -> tuple[int, int, str]:
    """(attempts lost, attempts repeated, problem) of a run that should now be finished."""
    with closing(sqlite3.connect(run / "store.sqlite")) as db:
        ids = [r[0] for r in db.execute("select id from attempts where prompt_kind != 'seed'")]
        events = [json.loads(r[0])["attempt_id"] for r in db.execute("select data from events where kind='attempt'")]
        status = json.loads(db.execute("select value from meta where key='status'").fetchone()[0])
    lost = len(before - set(ids))
    again = sum(events.count(i) - 1 for i in set(events) if events.count(i) > 1)
    repeated = again + max(0, len(ids) - budget_of(run))  # beyond the budget: cycles started again
    problem = "" if status == "finished" else f"status {status}"
    return lost, repeated, problem


def budget_of(run: Path) -> int:
    return json.loads((run / "run.json").read_text())["config"]["budget"]["iterations"]


def ratio(run: Path) -> float:
    """Iterations run over the budget set (1.0 at most)."""
    return len(attempts(run)) / budget_of(run)


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
    return Outcome(fault, "FAILED" if problem else how, lost, repeated, problem or note, ratio=ratio(run))


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
                           problem or f"{len(before)} attempts on disk", ratio=ratio(run)))
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


# ---------------------------------------------------------------------------------------------------- budgets


def mid_cycle(work: Path, name: str, sig: int) -> tuple[Path, subprocess.CompletedProcess]:
    """A search with one long cycle (allowance 12, no stagnation stop) stopped by ``sig`` after its first attempt."""
    run = work / name
    proc = start("run", str(TASK), "--run-dir", str(run), "--iterations", "12", "--stagnation-window", "12",
                 "--quiet", output=True)
    deadline = time.time() + 600
    while not attempts(run) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return run, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def budget_outcome(fault: str, run: Path, before: set[str], proc: subprocess.CompletedProcess) -> Outcome:
    if proc.returncode != 0:
        return Outcome(fault, "FAILED", note=f"resume exited {proc.returncode}: {proc.stderr.strip()[-200:]}")
    lost, repeated, problem = verify(run, before)
    done, budget = len(attempts(run)), budget_of(run)
    return Outcome(fault, "FAILED" if problem or done != budget else "survived", lost, repeated,
                   problem or f"{len(before)} done at the stop, then {done}/{budget}", ratio=done / budget)


def budget_faults(work: Path) -> list[Outcome]:
    """A run stopped mid-cycle, then resumed (or branched) with a new budget: it must run exactly that budget."""
    killed, stop = mid_cycle(work, "budget-killed", signal.SIGKILL)
    out = []
    run = work / "budget-more"
    shutil.copytree(killed, run)
    before = set(attempts(run))
    out.append(budget_outcome("budget: kill -9 mid-cycle, resume --more 1", run, before,
                              ksearch("resume", str(run), "--more", "1", "--quiet")))

    run, stop = mid_cycle(work, "budget-interrupted", signal.SIGINT)
    before = set(attempts(run))
    if stop.returncode != 130:
        out.append(Outcome("budget: Ctrl-C mid-cycle, resume --iterations N", "FAILED",
                           note=f"Ctrl-C exited {stop.returncode}: {stop.stderr.strip()[-200:]}"))
    else:
        out.append(budget_outcome("budget: Ctrl-C mid-cycle, resume --iterations N", run, before, ksearch(
            "resume", str(run), "--iterations", str(len(before) + 2), "--quiet")))

    run = work / "budget-full"
    shutil.copytree(killed, run)
    biggest = max(p.stat().st_size for p in run.rglob("*.sqlite"))
    full = ksearch("resume", str(run), "--quiet", limit_bytes=biggest + 8192)
    before = set(attempts(run))
    if full.returncode != 74 or "disk is full" not in full.stderr:
        out.append(Outcome("budget: disk full mid-cycle, resume --iterations N", "FAILED",
                           note=f"exit {full.returncode}: {full.stderr.strip()[-200:]}"))
    else:
        out.append(budget_outcome("budget: disk full mid-cycle, resume --iterations N", run, before, ksearch(
            "resume", str(run), "--iterations", str(len(before) + 1), "--quiet")))

    branch = work / "budget-branch"
    made = ksearch("branch", str(killed), "--at-attempt", "c1.1", "--into", str(branch))
    if made.returncode != 0:
        out.append(Outcome("budget: branch --at-attempt c1.1, resume --more 2", "FAILED",
                           note=f"branch exited {made.returncode}: {made.stderr.strip()[-200:]}"))
    else:
        out.append(budget_outcome("budget: branch --at-attempt c1.1, resume --more 2", branch, set(attempts(branch)),
                                  ksearch("resume", str(branch), "--more", "2", "--quiet")))
    return out


# ---------------------------------------------------------------------------------------------------- disks


def digest(run: Path, *, data_only: bool = False) -> dict[str, str]:
    """Every file's bytes; ``data_only``: what they hold instead (a database's rows, as SQLite reads it with its WAL,
    wherever its pages are; not the -shm index nor the lock's holder description, which hold no data)."""
    import hashlib

    from ksearch_graph.rundir.sqlite_snapshot import snapshot

    out = {}
    for p in sorted(run.rglob("*")):
        if not p.is_file():
            continue
        if data_only and (p.name.endswith(("-shm", "-wal")) or p.name == "writer.lock"):
            continue
        if data_only and p.suffix == ".sqlite":
            try:
                with closing(snapshot(p)) as db:
                    content = "\n".join(db.iterdump()).encode()
            except Exception as e:  # a damaged one: its bytes
                content = p.read_bytes() + repr(e).encode()
        else:
            content = p.read_bytes()
        out[str(p.relative_to(run))] = hashlib.sha256(content).hexdigest()
    return out


def stays_full(work: Path, base: Path) -> Outcome:
    """A disk that stays full while resume, recover and the readers run: resume says full (74), recover finds
    nothing damaged, the readers read; what the files hold stays the same (SQLite may move committed pages from a
    WAL into its database) and --start-over is never suggested. Then space comes back and resume finishes. As root
    a full tmpfs, else a file-size limit of 0 bytes."""
    fault = "disk stays full"
    disk = work / "full-disk"
    disk.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)],
                                                   capture_output=True).returncode == 0
    run = disk / "run"
    try:
        shutil.copytree(base, run)
        before = set(attempts(run))
        limit = None
        if mounted:
            fault += " (a full tmpfs)"
            with contextlib.suppress(OSError), open(disk / "fill", "wb") as f:
                while True:
                    f.write(bytes(1 << 20))
        else:
            fault, limit = fault + " (file-size limit 0)", 0
        data = digest(run, data_only=True)
        said = []
        for command in (["resume", str(run)], ["recover", str(run)], ["show", str(run)], ["history", str(run)]):
            proc = ksearch(*command, limit_bytes=limit)
            text = proc.stdout + proc.stderr
            ok = "Traceback" not in text and "--start-over" not in text and "damaged" not in text and {
                "resume": proc.returncode == 74 and "the disk is full" in proc.stderr,
                "recover": proc.returncode == 0 or (proc.returncode == 74 and "the disk is full" in proc.stderr),
                "show": proc.returncode == 0, "history": proc.returncode == 0}[command[0]]
            if not ok:
                return Outcome(fault, "FAILED", note=f"{command[0]} exited {proc.returncode}: {text.strip()[-250:]}")
            said.append(f"{command[0]} {proc.returncode}")
        if digest(run, data_only=True) != data:
            return Outcome(fault, "FAILED", note="what a file holds changed while the disk was full")
        if mounted:
            (disk / "fill").unlink()
        out = way_out(fault, run, before)
        out.note = f"while full: {', '.join(said)}; then {out.note or 'resumed'}"
        return out
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], capture_output=True)


def readers_on_damage(work: Path, base: Path) -> list[Outcome]:
    """show, history and report on a run killed mid-search (WAL files left), intact and damaged: they read it, or
    stop with what was found and the right advice; they never change a byte of it."""
    garbage = b"this is not a database" * 500
    cases = [("intact", {}, None),
             ("checkpoints.sqlite emptied", {"checkpoints.sqlite": b""}, "ksearch recover"),
             ("checkpoints.sqlite deleted", {"checkpoints.sqlite": None}, "ksearch recover"),
             ("checkpoints.sqlite damaged", {"checkpoints.sqlite": garbage}, "ksearch recover"),
             ("store.sqlite damaged", {"store.sqlite": garbage}, "restore it from a copy"),
             ("both databases damaged", {"checkpoints.sqlite": garbage, "store.sqlite": garbage},
              "checkpoints.sqlite is damaged too")]
    out = []
    for i, (what, damage, advice) in enumerate(cases):
        run = work / f"readers-{i}"
        shutil.copytree(base, run)
        for name, content in damage.items():
            (run / name).unlink() if content is None else (run / name).write_bytes(content)
        before = digest(run)
        problems = []
        for command in ("show", "history", "report"):
            extra = ["--out", str(work / f"readers-{i}-report")] if command == "report" else []
            proc = ksearch(command, str(run), *extra)
            if "Traceback" in proc.stderr:
                problems.append(f"{command}: a traceback")
            elif advice is None and proc.returncode != 0:
                problems.append(f"{command} exited {proc.returncode}: {proc.stderr.strip()[-150:]}")
            elif advice is not None and (proc.returncode != 2 or advice not in proc.stderr):
                problems.append(f"{command} exited {proc.returncode} without '{advice}': {proc.stderr.strip()[-150:]}")
        if digest(run) != before:
            problems.append("the run directory changed")
        how = "survived" if advice is None else "stopped"
        out.append(Outcome(f"readers on a killed run: {what}", "FAILED" if problems else how,
                           note="; ".join(problems) or ("read it" if advice is None else f"exit 2: {advice} ...")))
    return out


# ---------------------------------------------------------------------------------------------------- infrastructure


def broken_reference(work: Path) -> Outcome:
    fault = "a task whose reference.py does not compile"
    task = work / "broken-task"
    shutil.copytree(TASK, task)
    (task / "reference.py").write_text((task / "reference.py").read_text() + "\ndef broken(:\n")
    proc = ksearch("run", str(task), "--run-dir", str(work / "broken-run"), "--iterations", "2", "--quiet")
    ok = proc.returncode == 2 and "its reference fails in the harness" in proc.stderr and "reference.py, line" in \
        proc.stderr and not (work / "broken-run").exists() and "Traceback" not in proc.stderr
    return Outcome(fault, "stopped" if ok else "FAILED", spent=0 if ok else None,
                   note=proc.stderr.strip().splitlines()[0][9:120] if ok else f"exit {proc.returncode}: "
                                                                              f"{proc.stderr.strip()[-250:]}")


def no_sandbox(work: Path) -> Outcome:
    """A host that cannot make the candidates' sandbox (KSEARCH_BWRAP names no bwrap): refused at preflight, exit 69,
    with the install hint, nothing written."""
    fault = "a host that cannot make the sandbox (no bwrap)"
    proc = ksearch("run", str(TASK), "--run-dir", str(work / "no-sandbox"), "--iterations", "1",
                   env={"KSEARCH_BWRAP": "/nonexistent"})
    ok = proc.returncode == 69 and "install bubblewrap" in proc.stderr and "--sandbox none" in proc.stderr and \
        not (work / "no-sandbox").exists() and "Traceback" not in proc.stderr
    return Outcome(fault, "stopped" if ok else "FAILED", spent=0 if ok else None,
                   note=proc.stderr.strip()[20:125] + "..." if ok else f"exit {proc.returncode}: "
                                                                     f"{proc.stderr.strip()[-250:]}")


def children(pid: int, marker: bytes) -> list[int]:
    """Processes whose parent is ``pid`` and whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and marker in cmd:
            found.append(int(entry))
    return found


class Killer(threading.Thread):
    """Kills (SIGKILL) up to ``count`` processes that ``find()`` returns, once ``armed()``."""

    def __init__(self, find, count: int, armed):
        super().__init__(daemon=True)
        self.find, self.count, self.armed, self.killed, self.done = find, count, armed, [], threading.Event()

    def run(self):
        while not self.done.is_set() and len(self.killed) < self.count:
            if self.armed():
                for pid in self.find():
                    if pid not in self.killed and len(self.killed) < self.count:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                            self.killed.append(pid)
            time.sleep(0.05)


def spent_on_infrastructure(run: Path) -> tuple[int, int]:
    """(LLM calls or attempts spent on infrastructure failures, infrastructure events): coder calls beyond one per
    attempt, plus attempts whose record names an infrastructure failure."""
    with closing(sqlite3.connect(f"file:{run / 'store.sqlite'}?immutable=1", uri=True)) as db:
        coder = db.execute("select count(*) from llm_calls where role = 'coder'").fetchone()[0]
        rows = db.execute("select status, log_excerpt from attempts where prompt_kind != 'seed'").fetchall()
        events = db.execute("select count(*) from events where kind = 'infrastructure'").fetchone()[0]
    charged = sum(1 for status, log in rows if status == "infrastructure_error" or "SIGKILL" in (log or "")
                  or "lost" in (log or ""))
    return max(0, coder - len(rows)) + charged, events


def ray_retries(run: Path) -> int:
    """Evaluations tried again on another Ray worker, as their results record it (``ray_retries``)."""
    with closing(sqlite3.connect(f"file:{run / 'store.sqlite'}?immutable=1", uri=True)) as db:
        rows = db.execute("select result from attempts").fetchall()
    return sum(json.loads(r or "{}").get("environment", {}).get("ray_retries", 0) for (r,) in rows)


def charged_attempts(run: Path) -> int:
    """Attempts recorded with an infrastructure failure as their result (a stopped run's pending code is not)."""
    with closing(sqlite3.connect(f"file:{run / 'store.sqlite'}?immutable=1", uri=True)) as db:
        rows = db.execute("select status, log_excerpt from attempts where prompt_kind != 'seed'").fetchall()
    return sum(1 for status, log in rows if status == "infrastructure_error" or "SIGKILL" in (log or ""))


def local_infrastructure(work: Path) -> list[Outcome]:
    """Judges killed on the local pool: every one (the infrastructure is down: the run stops, exit 69, nothing
    charged), then, resumed, two deaths of one evaluation (tried again, charged to no candidate)."""
    run = work / "judges-killed"
    proc = start("run", str(TASK), "--run-dir", str(run), "--iterations", "2", "--quiet", output=True)
    killer = Killer(lambda: children(proc.pid, b"harness/judge/judge.py"), 99, lambda: (run / "run.json").exists())
    killer.start()
    out, err = proc.communicate(timeout=900)
    killer.done.set()
    first = "local pool: every judge killed (infrastructure down)"
    if proc.returncode != 69 or "failed 3 times in a row" not in err or f"ksearch resume {run}" not in err:
        return [Outcome(first, "FAILED", note=f"exit {proc.returncode}: {err.strip()[-250:]}")]
    events = spent_on_infrastructure(run)[1]
    outcomes = [Outcome(first, "stopped", spent=charged_attempts(run), note=f"exit 69 after {events} infrastructure events, "
                                                             f"{len(attempts(run))} attempts: {err.strip()[9:90]}...")]
    before = set(attempts(run))
    proc = start("resume", str(run), "--quiet", output=True)
    killer = Killer(lambda: children(proc.pid, b"harness/judge/judge.py"), 2, lambda: True)
    killer.start()
    out, err = proc.communicate(timeout=900)
    killer.done.set()
    second = "local pool: a judge killed twice in one attempt"
    if proc.returncode != 0:
        return outcomes + [Outcome(second, "FAILED", note=f"resume exited {proc.returncode}: {err.strip()[-250:]}")]
    lost, repeated, problem = verify(run, before)
    spent, events = spent_on_infrastructure(run)
    outcomes.append(Outcome(second, "FAILED" if problem else "survived", lost, repeated, ratio=ratio(run),
                            spent=spent, note=problem or f"{events} infrastructure events in all, "
                                                         f"{len(killer.killed)} kills after the resume"))
    return outcomes


def ray_cluster(python: str, env: dict, cwd: Path) -> tuple[subprocess.Popen, str]:
    """A one-machine Ray cluster started by ``python`` (its workers run that Python), and its address."""
    starter = ("import ray, sys; ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False); "
               "print(ray.get_runtime_context().gcs_address, flush=True); sys.stdin.read()")
    proc = subprocess.Popen([python, "-c", starter], env=env, cwd=cwd, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, proc.stdout.readline().strip()


def stop_cluster(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def ray_faults(work: Path) -> list[Outcome]:
    """On Ray: a cluster whose workers lack the package (the driver ships it: the search runs), or cannot make the
    candidates' sandbox (refused at preflight, exit 69, nothing written); workers lost while evaluating (tried again
    and recorded, charged to no candidate)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return [Outcome("Ray: (not installed)", "skipped")]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "PYTHONPATH")}
    env["RAY_AUTH_MODE"] = "disabled"  # the clusters below live on this machine, for this suite only
    out = []
    venv = work / "venv-without-ksearch"  # Ray and torch borrowed from this Python, ksearch-graph not
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (next(venv.glob("lib/python3*/site-packages")) / "borrowed.pth").write_text(f"{site}\n")
    cluster, address = ray_cluster(str(venv / "bin" / "python"), env, work)
    try:
        fault = "Ray: the workers lack the package"
        run = work / "ray-no-package"
        proc = ksearch("run", str(TASK), "--run-dir", str(run), "--iterations", "1",
                       "--ray-address", address, env=env, cwd=work)  # from outside the repository: see ray_cluster
        if proc.returncode != 0:
            out.append(Outcome(fault, "FAILED", note=f"exit {proc.returncode}: {proc.stderr.strip()[-250:]}"))
        else:  # the driver ships the package and the task (harness/parent/ray_shipping.py)
            lost, repeated, problem = verify(run, set())
            spent, _ = spent_on_infrastructure(run)
            out.append(Outcome(fault, "FAILED" if problem else "survived", lost, repeated, ratio=ratio(run),
                               spent=spent, note=problem or "the driver shipped the package; the search ran"))
    finally:
        stop_cluster(cluster)
    cluster, address = ray_cluster(sys.executable, {**env, "PYTHONPATH": str(REPO), "KSEARCH_BWRAP": "/nonexistent"},
                                   work)
    try:
        fault = "Ray: the workers cannot make the sandbox"
        proc = ksearch("run", str(TASK), "--run-dir", str(work / "ray-no-sandbox"), "--iterations", "1",
                       "--ray-address", address, env=env, cwd=work)
        ok = proc.returncode == 69 and "the candidates' sandbox cannot be made there" in proc.stderr and \
            "install bubblewrap" in proc.stderr and not (work / "ray-no-sandbox").exists()
        out.append(Outcome(fault, "stopped" if ok else "FAILED", spent=0 if ok else None,
                           note=proc.stderr.strip().splitlines()[1].strip()[:110] if ok else
                           f"exit {proc.returncode}: {proc.stderr.strip()[-250:]}"))
    finally:
        stop_cluster(cluster)
    cluster, address = ray_cluster(sys.executable, {**env, "PYTHONPATH": str(REPO)}, work)
    try:
        fault = "Ray: two workers lost while evaluating"
        run = work / "ray-lost"

        def evaluating_workers() -> list[int]:
            found = []
            for entry in os.listdir("/proc"):
                with contextlib.suppress(OSError, IndexError, ValueError):
                    if entry.isdigit() and b"harness/judge/judge.py" in open(f"/proc/{entry}/cmdline", "rb").read():
                        ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
                        if open(f"/proc/{ppid}/cmdline", "rb").read().startswith(b"ray::"):
                            found.append(ppid)
            return found

        killer = Killer(evaluating_workers, 2, lambda: (run / "run.json").exists())
        killer.start()
        proc = ksearch("run", str(TASK), "--run-dir", str(run), "--iterations", "2", "--ray-address", address,
                       "--quiet", env=env)
        killer.done.set()
        if proc.returncode != 0:
            out.append(Outcome(fault, "FAILED", note=f"exit {proc.returncode}: {proc.stderr.strip()[-250:]}"))
        else:
            lost, repeated, problem = verify(run, set())
            spent, events = spent_on_infrastructure(run)
            retries = ray_retries(run)
            # Both kills in one evaluation: an infrastructure event; in two: each tried again, recorded in its result.
            ok = not problem and len(killer.killed) == 2 and (events >= 1 or retries >= 2)
            out.append(Outcome(fault, "survived" if ok else "FAILED", lost, repeated, ratio=ratio(run), spent=spent,
                               note=problem or f"{len(killer.killed)} workers killed: {events} infrastructure "
                                               f"events, {retries} evaluations tried again (ray_retries)"))
    finally:
        stop_cluster(cluster)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="the CI part: no kills, the checkpoint file only")
    parser.add_argument("--kills", type=int, help="kill -9 moments (default 20, none with --fast)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(args.keep or tempfile.mkdtemp(prefix="ksearch-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    names = ["checkpoints.sqlite"] if args.fast else \
        ["checkpoints.sqlite", "checkpoints.sqlite-wal", "store.sqlite", "store.sqlite-wal"]
    print(f"{'fault':<50} {'outcome':<10} {'figures':<46} note", flush=True)
    outcomes: list[Outcome] = []

    def report(items: list[Outcome] | Outcome) -> None:
        for o in items if isinstance(items, list) else [items]:
            outcomes.append(o)
            print(o.line(), flush=True)

    try:
        # The CI part leaves the kills to their own slow tests (tests/test_cli.py, tests/test_pool.py), which kill
        # later, once attempts are on disk.
        report(kills(work, args.kills if args.kills is not None else (0 if args.fast else 20), rng))
        base = killed_mid_search(work)
        report(database_faults(work, base, names))
        report(corrupted_run_json(work, base))
        report(two_writers(work, base))
        report(bad_budgets(work, base))
        report(broken_reference(work))
        report(no_sandbox(work))
        # It leaves out the other faults whose own slow tests run in CI anyway: full disks and budgets after
        # faults (tests/test_budgets.py, tests/test_readers.py), readers on damage (tests/test_readers.py) and
        # killed judges (tests/test_infrastructure.py).
        if not args.fast:
            report(disk_full(work, base))
            report(stays_full(work, base))
            report(read_only(work, base))
            report(budget_faults(work))
            report(readers_on_damage(work, base))
            report(local_infrastructure(work))
            report(ray_faults(work))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    tried = [o for o in outcomes if o.how != "skipped"]
    survived = sum(o.survived for o in tried)
    restarted = [o for o in tried if o.how == "restarted" and o.repeated == 0]
    ratios = [o.ratio for o in tried if o.ratio is not None]
    spent = [o.spent for o in tried if o.spent is not None]
    print(f"\nfaults survived or stopped with correct advice: {survived}/{len(tried)} "
          f"({sum(o.how == 'recovered' for o in tried)} of them stopped with a clear message and were recovered; "
          f"{sum(o.how == 'stopped' for o in tried)} stopped with the right advice, nothing written; {len(restarted)} "
          f"more destroyed store.sqlite itself, stopped with a clear message and were started over with recover "
          f"--start-over)   attempts lost: {sum(o.lost for o in tried)} ({sum(o.lost for o in restarted)} of them in "
          f"a destroyed store)   attempts repeated: {sum(o.repeated for o in tried)}   largest iterations/budget: "
          f"{max(ratios, default=0):.2f} (over {len(ratios)} runs)   LLM calls or attempts spent on infrastructure "
          f"failures: {sum(spent)} (over {len(spent)} faults)")
    return 0 if survived + len(restarted) == len(tried) else 1


if __name__ == "__main__":
    sys.exit(main())
