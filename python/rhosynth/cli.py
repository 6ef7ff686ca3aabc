"""Runs the `rhosynth` binary the wheel ships: its JSON answer, its progress shown as it
comes, its exit status as an exception, and an interrupt passed on so the job stops
cleanly."""

import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from importlib import metadata

from . import frames
from .errors import JobFailed, LedgerRefused, SpecError

#: The CLI's exit status for a charge the ledger refuses.
EXIT_BUDGET_REFUSED = 3
#: The CLI's exit status for a job stopped by an interrupt (128 + SIGINT).
EXIT_INTERRUPTED = 130
#: `rhosynth audit`'s exit status when the release proves more than the claimed ε.
EXIT_AUDIT_FAILED = 4


def binary():
    """The `rhosynth` executable: $RHOSYNTH_BINARY, else the one the wheel installed with
    this very package (its RECORD lists both), owned by this user or root and writable by
    no one else. Never another found on PATH: it could be another version, or another
    user's."""
    named = os.environ.get("RHOSYNTH_BINARY")
    if named:
        return named
    here = os.path.realpath(os.path.join(os.path.dirname(__file__), "__init__.py"))
    for dist in metadata.distributions(name="rhosynth"):
        files = dist.files or []
        if not any(f.name == "__init__.py" and os.path.realpath(f.locate()) == here for f in files):
            continue  # another installation of the package
        for file in files:
            path = os.path.normpath(file.locate())
            if file.name != "rhosynth" or file.parent.name != "bin" or not os.access(path, os.X_OK):
                continue
            info = os.stat(path)
            if info.st_uid in (0, os.getuid()) and not info.st_mode & 0o022:
                return path
    raise FileNotFoundError(
        "the rhosynth binary is not installed beside this package (pip install the rhosynth wheel), "
        "and RHOSYNTH_BINARY names none"
    )


class Progress:
    """A job's progress as the CLI reports it (`--progress json`): a tqdm bar where tqdm is
    installed (a widget in Jupyter), else one line rewritten on stderr."""

    def __init__(self, enabled, label):
        self.enabled, self.label, self.bar = enabled, label, None

    def update(self, event):
        if not self.enabled:
            return
        total, done = event.get("total", 0), event.get("done", 0)
        text = f"{event.get('message', '')} (ε spent {event.get('epsilon_spent', 0):.4g})"
        try:
            from tqdm.auto import tqdm
        except ImportError:
            sys.stderr.write(f"\r{self.label}: {done}/{total} {text}\033[K")
            sys.stderr.flush()
            return
        if self.bar is None:
            self.bar = tqdm(total=total or None, desc=self.label, unit="task")
        if total and self.bar.total != total:
            self.bar.total = total
        self.bar.n = done
        self.bar.set_postfix_str(text, refresh=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


def run(args, progress=False, label="rhosynth", allowed=(), env=None, detached=False):
    """Runs `rhosynth ARGS`; returns its JSON answer (stdout). Raises `LedgerRefused` on
    exit status 3, `JobFailed` when a started job failed, `SpecError` for anything refused
    before; on KeyboardInterrupt the job is interrupted, waited for, and the interrupt
    raised again (unless the release had begun: the job then ends released and its
    answer is returned, with a warning). Exit statuses in `allowed` answer too.
    `detached`: the command only follows a job elsewhere (`submit`): an interrupt stops
    following and the job runs on."""
    if progress:
        args = list(args) + ["--progress", "json"]
    proc = subprocess.Popen(
        [binary(), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        env=None if env is None else {**os.environ, **env},
        # The input files' locks: a file stays while this CLI reads it, this process or not.
        pass_fds=frames.held_locks(),
        # Its own process group: a terminal's Ctrl-C reaches Python, which passes it on once.
        start_new_session=True,
    )
    shown = Progress(progress, label)
    err_lines, out = [], []
    readers = [
        threading.Thread(target=_read_stderr, args=(proc.stderr, err_lines, shown), daemon=True),
        threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    interrupted = False
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        # The job stops, or, when its release had begun, runs to its end: wait for either
        # (a second interrupt leaves it to finish on its own).
        interrupted = True
        proc.send_signal(signal.SIGINT)
        code = proc.wait()
    finally:
        for reader in readers:
            reader.join(timeout=5)
        shown.close()
    if interrupted and detached:
        raise KeyboardInterrupt("stopped following the job: it runs on at the coordinator")
    if interrupted and code != 0:
        raise KeyboardInterrupt("the job was cancelled before its release: nothing was released")
    if interrupted:
        warnings.warn("interrupted after the job's release had begun: it ran to its end and is released")
    return _answer(code, "".join(out), err_lines, allowed)


def _read_stderr(stream, lines, shown):
    for line in stream:
        if line.startswith('{"progress":'):
            try:
                shown.update(json.loads(line)["progress"])
                continue
            except (ValueError, KeyError):
                pass
        lines.append(line.rstrip("\n"))


def _answer(code, stdout, err_lines, allowed=()):
    answer = None
    if stdout.strip():
        try:
            answer = json.loads(stdout)
        except ValueError:
            answer = None
    if code == 0 or code in allowed:
        return answer
    # The CLI's error: from its last "error: " line to the end (a cause may follow it).
    starts = [i for i, line in enumerate(err_lines) if line.startswith("error: ")]
    told = "\n".join(err_lines[starts[-1] :])[len("error: ") :] if starts else "\n".join(err_lines[-5:])
    message = (answer or {}).get("error") or told
    if code == EXIT_BUDGET_REFUSED:
        raise LedgerRefused(message)
    if code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt(message)
    if isinstance(answer, dict) and answer.get("state") == "failed":
        raise JobFailed(message, answer.get("job_id"))
    raise SpecError(message)
