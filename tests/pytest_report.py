#!/usr/bin/env python3
"""`kvbatch report --format json|csv` against the text form, on real runs of
the default model; and the per-request columns of metrics schema 2.

A small job (a shared system prompt, seven kinds of bad line) is run twice:
once with room to spare, once with a KV cache so small that the scheduler
preempts all the time. For each database, for the two taken as one
(`report A B`) and for `--list`: the text form is parsed line by line — a
line the parser does not know fails the test, so a figure added to the text
must be added here, and so to JSON and CSV — and every figure in it must be
in the JSON and in the CSV, to the precision the text prints. The request
rows must carry wall-clock times that agree with the durations (queue, first
token, end to end), the error lines' messages, and preemption counts that
add up to what the report says (and are > 0 in the tight run).

Run by ctest (KVB_BIN, KVB_MODEL set); exits 77 to skip without them.
"""
import csv
import datetime
import io
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import tempfile

from kvbcheck import BIN, MODEL, check, finish, ready

SYSTEM = "You are a terse assistant. Answer in one short sentence, please."


def make_job(path):
    lines = []
    for i in range(14):
        lines.append({"custom_id": f"r{i}", "body": {"messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Tell me one fact about the number {i * 7 + 3}."}],
            "max_tokens": 12 + i % 5, "temperature": 0}})
    lines = [json.dumps(x) for x in lines]
    # seven kinds of failure, so the text form shows its top five and "2 others"
    lines.insert(3, '{"custom_id": "bad-json", "body": {')
    lines.insert(5, '[1, 2, 3]')
    lines.insert(6, json.dumps({"body": {"prompt": "no id", "max_tokens": 2}}))
    lines.insert(8, json.dumps({"custom_id": "bad-type", "prompt": "x", "temperature": "hot"}))
    lines.insert(9, json.dumps({"custom_id": "bad-value", "prompt": "x", "max_tokens": -5}))
    lines.insert(10, json.dumps({"custom_id": "r1", "prompt": "repeated id", "max_tokens": 2}))
    lines.insert(11, json.dumps({"custom_id": "too-long", "prompt": "word " * 400, "max_tokens": 2}))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def kvb(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True)


# ---- the text form, parsed ---------------------------------------------------------

NUM = r"(-?[0-9]+(?:\.[0-9]+)?)"


def dec(s):
    """The precision a printed number carries: half its last digit."""
    return 0.5 * 10 ** -(len(s.split(".")[1]) if "." in s else 0)


def parse_text(text):
    """Every figure of the text form as {key: (value, tolerance)} (strings
    with tolerance None), and the lines it did not understand."""
    f, unknown = {}, []
    lat_names = {"queue": "queue", "time to 1st token": "ttft", "time per out token": "tpot", "end to end": "e2e"}
    share_names = {"in-run cache": "in_run_cache", "persistent store": "persistent_store",
                   "prefill computed": "computed"}

    def num(key, s):
        f[key] = (float(s), dec(s))

    for line in text.splitlines():
        m = None
        if (m := re.fullmatch(r"combined: the latest run of each of (\d+) databases: (.*)", line)):
            f["combined.n"] = (int(m[1]), 0)
            f["combined.databases"] = (m[2].split(" "), None)
        elif (m := re.fullmatch(r"warning: (.*)", line)):
            f.setdefault("combined.warnings", ([], None))[0].append(m[1])
        elif (m := re.fullmatch(r"(run (\d+)|all of them): (\S+)", line)):
            f["run.label"] = (m[1], None)
            if m[2]:
                f["run.id"] = (int(m[2]), 0)
            f["run.status"] = (m[3], None)
        elif (m := re.fullmatch(r"  (job|output|model|model fingerprint|backend|settings) {2,}(.*)", line)):
            key = {"job": "job_file", "output": "output_file", "model fingerprint": "model_fingerprint"}.get(m[1], m[1])
            f["run." + key] = (None if m[2] == "-" else m[2], None)
        elif (m := re.fullmatch(r"  (started|ended) {2,}(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4})", line)):
            t = datetime.datetime.strptime(m[2], "%Y-%m-%d %H:%M:%S %z").timestamp()
            f[f"run.{m[1]}_at"] = (t, 1.0)
        elif line == "  ended              - (still running, or its process died)":
            f["run.ended_at"] = (None, None)
        elif (m := re.fullmatch(r"  wall time {10}" + NUM + " s", line)):
            num("run.wall_seconds", m[1])
        elif line.startswith("  (no totals recorded"):
            f["run.totals_recorded"] = (False, None)
        elif (m := re.fullmatch(r"requests {13}(\d+) total: (\d+) ok, (\d+) failed", line)):
            for k, v in zip(("total", "ok", "failed"), m.groups()):
                f["requests." + k] = (int(v), 0)
        elif (m := re.fullmatch(r"  (errors|finish reasons) {2,}(.*)", line)):
            items = m[2].split(", ")
            kind = "errors" if m[1] == "errors" else "finish"
            if (o := re.fullmatch(r"(\d+) others (\d+)", items[-1])):
                f[kind + ".others"] = ((int(o[1]), int(o[2])), None)
                items = items[:-1]
            for it in items:
                k, n = it.rsplit(" ", 1)
                f[f"{kind}.{k}"] = (int(n), 0)
        elif (m := re.fullmatch(r"tokens {15}prompt (\d+), completion (\d+), total (\d+)", line)):
            for k, v in zip(("prompt", "completion", "total"), m.groups()):
                f["tokens." + k] = (int(v), 0)
        elif (m := re.fullmatch(r"throughput {11}" + NUM + " completion tok/s, " + NUM + " total tok/s, " + NUM +
                                r" requests/s \(over wall time\)", line)):
            num("throughput.completion_tokens_per_s", m[1])
            num("throughput.total_tokens_per_s", m[2])
            num("throughput.requests_per_s", m[3])
        elif line == "throughput           - (no wall time recorded)":
            f["throughput.completion_tokens_per_s"] = (None, None)
        elif re.fullmatch(r"latency \(ms\) +p50 +p95 +p99 +max +n", line):
            pass
        elif (m := re.fullmatch(r"  (queue|time to 1st token|time per out token|end to end) +(.*)", line)):
            vals = m[2].split()
            name = lat_names[m[1]]
            for k, v in zip(("p50", "p95", "p99", "max"), vals[:4]):
                if v == "-":
                    f[f"latency.{name}.{k}"] = (None, None)
                else:
                    num(f"latency.{name}.{k}", v)
            f[f"latency.{name}.n"] = (int(vals[4]), 0)
        elif (m := re.fullmatch(r"preemptions {10}(\d+) requests preempted, (\d+) times, (\d+) positions restored",
                                line)):
            for k, v in zip(("requests", "times", "restored_tokens"), m.groups()):
                f["preemptions." + k] = (int(v), 0)
        elif line.startswith("preemptions          - (not recorded"):
            f["preemptions"] = (None, None)
        elif line == "prefix reuse":
            pass
        elif (m := re.fullmatch(r"  (in-run cache|persistent store|prefill computed) +(\d+) of (\d+) prompt tokens"
                                r"(?: \(" + NUM + r" %\))?", line)):
            name = share_names[m[1]]
            f[f"reuse.{name}.tokens"] = (int(m[2]), 0)
            f["reuse.prompt_tokens"] = (int(m[3]), 0)
            if m[4]:
                f[f"reuse.{name}.share"] = (float(m[4]) / 100, dec(m[4]) / 100)
        elif (m := re.fullmatch(r"store {16}read (.*), written (.*)", line)):
            for k, v in (("bytes_read", m[1]), ("bytes_written", m[2])):
                b = re.search(r"\((\d+) bytes\)", v) or re.fullmatch(r"(\d+) B", v)
                f["store." + k] = (int(b[1]), 0)
        elif line == "store                - (recorded when the run ends)":
            f["store"] = (None, None)
        else:
            unknown.append(line)
    return f, unknown


# ---- the same figures from JSON and from CSV -----------------------------------------

def from_json(j):
    g = {}
    r = j["run"]
    g["run.id"] = r["id"]
    g["run.label"] = r["label"]
    g["run.status"] = r["status"]
    for k in ("job_file", "output_file", "model", "model_fingerprint", "backend"):
        g["run." + k] = r[k]
    g["run.settings"] = r["settings"] if isinstance(r["settings"], (str, type(None))) else \
        json.dumps(r["settings"], separators=(",", ":"))
    g["run.started_at"] = r["started_at"]
    g["run.ended_at"] = r["ended_at"]
    g["run.wall_seconds"] = r["wall_seconds"]
    g["run.totals_recorded"] = r["totals_recorded"]
    for k in ("total", "ok", "failed"):
        g["requests." + k] = j["requests"][k]
    for kind, items, key in (("errors", j["errors"], "code"), ("finish", j["finish_reasons"], "reason")):
        top = 5 if kind == "errors" else 8
        for e in items[:top]:
            g[f"{kind}.{e[key]}"] = e["count"]
        if len(items) > top:
            g[kind + ".others"] = (len(items) - top, sum(e["count"] for e in items[top:]))
    for k in ("prompt", "completion", "total"):
        g["tokens." + k] = j["tokens"][k]
    for k, v in j["throughput"].items():
        g["throughput." + k] = v
    for name, d in j["latency_ms"].items():
        for k, v in d.items():
            g[f"latency.{name}.{k}"] = v
    if j["preemptions"] is None:
        g["preemptions"] = None
    else:
        for k, v in j["preemptions"].items():
            g["preemptions." + k] = v
    pr = j["prefix_reuse"]
    g["reuse.prompt_tokens"] = pr["prompt_tokens"]
    for name in ("in_run_cache", "persistent_store", "computed"):
        g[f"reuse.{name}.tokens"] = pr[name]["tokens"]
        g[f"reuse.{name}.share"] = pr[name]["share"]
    if j["store"] is None:
        g["store"] = None
    else:
        for k, v in j["store"].items():
            g["store." + k] = v
    if "combined" in j:
        g["combined.n"] = len(j["combined"]["databases"])
        g["combined.databases"] = j["combined"]["databases"]
        g["combined.warnings"] = j["combined"]["warnings"]
    return g


def from_csv(row):
    def n(k):
        return None if row[k] == "" else float(row[k])
    g = {"run.id": int(row["run_id"]), "run.label": row["label"], "run.status": row["status"]}
    for k in ("job_file", "output_file", "model", "model_fingerprint", "backend", "settings"):
        g["run." + k] = row[k] or None
    for k in ("started_at", "ended_at", "wall_seconds"):
        g["run." + k] = n(k)
    g["run.totals_recorded"] = row["totals_recorded"] == "true"
    for k in ("total", "ok", "failed"):
        g["requests." + k] = int(row["requests_" + k])
    for kind, col, top in (("errors", "errors", 5), ("finish", "finish_reasons", 8)):
        items = [it.rsplit("=", 1) for it in row[col].split(";")] if row[col] else []
        for k, c in items[:top]:
            g[f"{kind}.{k}"] = int(c)
        if len(items) > top:
            g[kind + ".others"] = (len(items) - top, sum(int(c) for _, c in items[top:]))
    for k in ("prompt", "completion", "total"):
        g["tokens." + k] = int(row[k + "_tokens"])
    for k in ("completion_tokens_per_s", "total_tokens_per_s", "requests_per_s"):
        g["throughput." + k] = n(k)
    for name in ("queue", "ttft", "tpot", "e2e"):
        for k in ("p50", "p95", "p99", "max"):
            g[f"latency.{name}.{k}"] = n(f"{name}_{k}_ms")
        g[f"latency.{name}.n"] = int(row[f"{name}_n"])
    if row["preemptions"] == "":
        g["preemptions"] = None
    else:
        g["preemptions.requests"] = int(row["preempted_requests"])
        g["preemptions.times"] = int(row["preemptions"])
        g["preemptions.restored_tokens"] = int(row["restored_tokens"])
    g["reuse.prompt_tokens"] = int(row["prompt_tokens"])
    for name, tok, sh in (("in_run_cache", "cached_tokens_run", "cached_share_run"),
                          ("persistent_store", "cached_tokens_store", "cached_share_store"),
                          ("computed", "prefill_tokens_computed", "computed_share")):
        g[f"reuse.{name}.tokens"] = int(row[tok])
        g[f"reuse.{name}.share"] = n(sh)
    if row["store_bytes_read"] == "":
        g["store"] = None
    else:
        g["store.bytes_read"] = int(row["store_bytes_read"])
        g["store.bytes_written"] = int(row["store_bytes_written"])
    if row["databases"]:
        g["combined.databases"] = row["databases"].split(";")
        g["combined.n"] = len(g["combined.databases"])
        g["combined.warnings"] = row["warnings"].split("\n") if row["warnings"] else []
    return g


def same(want, got):
    value, tol = want
    if tol is None or value is None:
        return value == got
    return got is not None and abs(float(got) - value) <= tol + 1e-9 * max(1.0, abs(value))


def compare(what, text_figs, other):
    """Every figure of the text form must be in `other`, equal to it to the
    text's precision."""
    missing = [k for k in text_figs if k not in other]
    check(not missing, f"{what}: figures of the text form missing: {missing}")
    for k, want in text_figs.items():
        if k in other:
            check(same(want, other[k]), f"{what}: {k}: text {want[0]!r}, here {other[k]!r}")


def check_forms(what, args):
    """The text, JSON and CSV forms of one report carry the same figures."""
    t = kvb("report", *args)
    j = kvb("report", *args, "--format", "json")
    c = kvb("report", *args, "--format=csv")
    if not check(t.returncode == 0 and j.returncode == 0 and c.returncode == 0,
                 f"{what}: exit {t.returncode}/{j.returncode}/{c.returncode}: {t.stderr}{j.stderr}{c.stderr}"):
        return None
    figs, unknown = parse_text(t.stdout)
    check(not unknown, f"{what}: text lines the test does not know (add them here and to JSON/CSV): {unknown}")
    check(len(figs) > 40, f"{what}: only {len(figs)} figures parsed from the text")
    try:
        jd = json.loads(j.stdout)
    except ValueError as e:
        check(False, f"{what}: JSON does not parse: {e}\n{j.stdout[:400]}")
        return None
    check(jd.get("kvbatch_report") == 1, f"{what}: JSON format version {jd.get('kvbatch_report')}")
    check(kvb("report", *args, "--json").stdout == j.stdout, f"{what}: --json differs from --format json")
    compare(what + " json", figs, from_json(jd))
    rows = list(csv.DictReader(io.StringIO(c.stdout, newline="")))
    if check(len(rows) == 1, f"{what}: CSV has {len(rows)} rows, want 1"):
        check(None not in rows[0] and None not in rows[0].values(), f"{what}: CSV row and header differ in length")
        compare(what + " csv", figs, from_csv(rows[0]))
    return jd


def check_list(db):
    t = kvb("report", db, "--list")
    j = kvb("report", db, "--list", "--format", "json")
    c = kvb("report", db, "--list", "--format", "csv")
    if not check(t.returncode == 0 and j.returncode == 0 and c.returncode == 0, f"--list: {j.stderr}{c.stderr}"):
        return
    text_rows = [ln.split() for ln in t.stdout.splitlines()[1:]]
    jr = json.loads(j.stdout)["runs"]
    cr = list(csv.DictReader(io.StringIO(c.stdout, newline="")))
    check(len(text_rows) == len(jr) == len(cr) >= 1, f"--list: {len(text_rows)} text, {len(jr)} json, {len(cr)} csv")
    for tr, a, b in zip(text_rows, jr, cr):
        ok, total = tr[5].split("/")
        check(int(tr[0]) == a["id"] == int(b["run_id"]), f"--list ids: {tr[0]} {a['id']} {b['run_id']}")
        check(tr[4] == a["status"] == b["status"], f"--list status: {tr[4]} {a['status']} {b['status']}")
        check(int(ok) == a["requests_ok"] == int(b["requests_ok"]) and
              int(total) == a["requests_total"] == int(b["requests_total"]), f"--list counts: {tr} {a} {b}")
        check(abs(float(tr[6]) - a["wall_seconds"]) <= 0.05 and abs(float(tr[6]) - float(b["wall_seconds"])) <= 0.05,
              f"--list wall: {tr[6]} {a['wall_seconds']}")


def check_rows(db, out_path, tight):
    """The per-request columns of schema 2."""
    con = sqlite3.connect(db)
    run_start, = con.execute("SELECT started_at FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    rows = con.execute("SELECT input_line, submitted_at, started_at, first_token_at, ended_at, queue_s, ttft_s, e2e_s,"
                       " preemptions, restored_tokens, error_code, error_message FROM requests").fetchall()
    ok = [r for r in rows if r[10] is None]
    bad = [r for r in rows if r[10] is not None]
    check(len(ok) == 14 and len(bad) == 7, f"{db}: {len(ok)} ok rows, {len(bad)} failed")
    for (line, sub, start, first, end, q, ttft, e2e, pre, rest, _, _) in ok:
        if not check(None not in (sub, start, first, end), f"{db} line {line}: times missing"):
            continue
        check(run_start - 1e-3 <= sub <= start <= first <= end, f"{db} line {line}: times out of order")
        # the times and the durations come from the same clock readings
        check(abs((start - sub) - q) < 2e-3 and abs((first - sub) - ttft) < 2e-3 and abs((end - sub) - e2e) < 2e-3,
              f"{db} line {line}: times {start - sub:.4f}/{first - sub:.4f}/{end - sub:.4f} vs durations "
              f"{q:.4f}/{ttft:.4f}/{e2e:.4f}")
        check(pre is not None and rest is not None and (pre > 0 or rest == 0),
              f"{db} line {line}: preemptions {pre}, restored {rest}")
    npre = sum(r[8] for r in ok)
    check((npre > 0) == tight, f"{db}: {npre} preemptions ({'tight' if tight else 'roomy'} KV cache)")
    if tight:
        check(all(r[9] > 0 for r in ok if r[8] > 0), f"{db}: a preempted request with nothing restored")
    # each error row holds the message of its error line
    msgs = {}
    for ln in open(out_path):
        d = json.loads(ln)
        if d.get("error"):
            msgs[d["error"]["message"]] = d["error"]["code"]
    for r in bad:
        check(r[11] in msgs and msgs[r[11]] == r[10], f"{db} line {r[0]}: message {r[11]!r} not in the output")
        check(r[4] is not None and r[4] >= run_start - 1e-3, f"{db} line {r[0]}: no end time for the error")
    return npre


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.jsonl")
        make_job(job)
        dbs = {}
        for name, extra in (("roomy", []), ("tight", ["--kv-mem", "4M"])):
            out = os.path.join(tmp, name + ".jsonl")
            dbs[name] = os.path.join(tmp, name + ".db")
            p = subprocess.run([BIN, "run", "--model", MODEL, "-i", job, "-o", out, "--metrics", dbs[name],
                                "--no-cache", "--ctx", "128", "-q", *extra], capture_output=True, text=True)
            if not check(p.returncode == 0, f"run {name}: exit {p.returncode}: {p.stderr}"):
                return finish("report")
            npre = check_rows(dbs[name], out, name == "tight")
            jd = check_forms(name, [dbs[name]])
            if jd and name == "tight":
                check(jd["preemptions"]["times"] == npre, f"report says {jd['preemptions']} preemptions, rows {npre}")
                check(len(jd["errors"]) == 7 and all(e["example_message"] for e in jd["errors"]),
                      f"errors: {jd['errors']}")
        # a second run into one database: --list has two rows, --run picks one
        p = subprocess.run([BIN, "run", "--model", MODEL, "-i", job, "-o", os.path.join(tmp, "again.jsonl"),
                            "--metrics", dbs["roomy"], "--no-cache", "--ctx", "128", "-q"], capture_output=True, text=True)
        check(p.returncode == 0, f"second run: {p.stderr}")
        check_list(dbs["roomy"])
        check_forms("run 1", [dbs["roomy"], "--run", "1"])
        jd = check_forms("combined", [dbs["roomy"], dbs["tight"]])
        if jd:
            check(jd["requests"]["total"] == 42 and jd["run"]["label"] == "all of them", f"combined: {jd['requests']}")
        # a resumed run: the combination warns (text), and JSON and CSV carry the warning
        p = subprocess.run([BIN, "run", "--model", MODEL, "-i", job, "-o", os.path.join(tmp, "tight.jsonl"),
                            "--metrics", os.path.join(tmp, "resumed.db"), "--no-cache", "--ctx", "128", "-q",
                            "--resume"], capture_output=True, text=True)
        check(p.returncode == 0, f"resumed run: {p.stderr}")
        jd = check_forms("combined, resumed", [dbs["roomy"], os.path.join(tmp, "resumed.db")])
        if jd:
            w = jd["combined"]["warnings"]
            check(len(w) == 1 and "resumed" in w[0] and ";" in w[0], f"combined warnings: {w}")
        # bad command lines
        for args in (["--format", "xml"], ["--list", "--html", os.path.join(tmp, "x.html")],
                     ["--html", "-", "--format", "json"], ["--html="]):
            p = kvb("report", dbs["tight"], *args)
            check(p.returncode == 2, f"report {args}: exit {p.returncode}, want 2 ({p.stderr.strip()})")
        p = kvb("report", dbs["tight"], "--html", os.path.join(tmp, "no", "such", "dir.html"))
        check(p.returncode == 1 and "dir.html" in p.stderr, f"--html into a missing directory: {p.returncode} {p.stderr}")
    return finish("report")


if __name__ == "__main__":
    sys.exit(main())
