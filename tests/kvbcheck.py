"""What the end-to-end Python tests share: the binary and model ctest
passes in (KVB_BIN, KVB_MODEL, KVB_SOURCE_DIR), soft checks collected
rather than stopping at the first, and the exit status ctest reads
(0 passed, 1 failed, 77 skipped)."""
import importlib
import os
import sys

BIN = os.environ.get("KVB_BIN")
MODEL = os.environ.get("KVB_MODEL")
SRC = os.environ.get("KVB_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
failures = []


def check(cond, msg):
    """Records a failure (and prints it) unless cond holds; returns cond."""
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)
    return cond


def ready():
    """Whether the binary and the model are there (else the test skips)."""
    if BIN and os.path.exists(BIN) and MODEL and os.path.exists(MODEL):
        return True
    print("SKIP: kvbatch binary or model missing (scripts/fetch-model.sh)")
    return False


def finish(what):
    """The exit status after the checks: 1 when any failed."""
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"all {what} checks passed")
    return 0


def need_modules(*names):
    """Imports names, or runs this test again under the test venv's python
    ($KVBATCH_VENV, default ~/.cache/kvbatch-venv: scripts/setup.sh --test makes
    it) once, or skips (exit 77) saying what is missing."""
    try:
        for n in names:
            importlib.import_module(n)
        return
    except ImportError as e:
        why = str(e)
    venv = os.environ.get("KVBATCH_VENV") or os.path.join(os.path.expanduser("~"), ".cache", "kvbatch-venv")
    py = os.path.join(venv, "bin", "python")
    if os.environ.get("KVB_TEST_REEXEC") or not os.access(py, os.X_OK):  # once: no loop if it lacks them too
        print("SKIP: %s not importable (%s) and no venv python at %s (scripts/setup.sh --test makes it)"
              % (", ".join(names), why, py))
        sys.exit(77)
    os.environ["KVB_TEST_REEXEC"] = "1"
    sys.stdout.flush()
    os.execv(py, [py, os.path.abspath(sys.argv[0])] + sys.argv[1:])
