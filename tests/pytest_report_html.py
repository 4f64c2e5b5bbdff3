#!/usr/bin/env python3
"""`kvbatch report --html` in a real browser (Debian's headless chromium).

A small job is run twice on the default model (once with a KV cache so small
that requests are preempted), and two pages are written: one run alone, and
the two runs compared. Each page must be self-contained (no script, no
reference to any file or address, nothing non-finite in the SVG) and
well-formed; then, in headless chromium, load with no console message (SVG
attribute errors, script errors), fetch nothing, render every chart (the
DOM after load), and give a screenshot that is not blank. The detector is
first shown a page broken on purpose, and must catch all three faults, so a
blind detector cannot pass.

Screenshots are kept in $KVB_REPORT_SHOTS (default: report-html/ in the
working directory, the build directory under ctest). Exits 77 when the
binary, the model or chromium is missing (after the checks that need no
browser). Chromium runs with name resolution mapped to nothing and its
background services off: it reaches no network.
"""
import html.parser
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import zlib

from kvbcheck import BIN, MODEL, check, failures, finish, ready

WIDTH, HEIGHT = 1100, 3000
SECTIONS = ["Throughput over time", "Running and waiting sequences", "Latency", "Prefix reuse", "Errors",
            "Slowest requests", "Runs"]
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source", "track", "embed", "param"}
SVG_LEAVES = {"line", "rect", "polyline", "path", "circle"}


def make_job(path):
    with open(path, "w") as f:
        for i in range(12):
            f.write(json.dumps({"custom_id": f"r{i}", "body": {"messages": [
                {"role": "system", "content": "You are a terse assistant. Answer in one short sentence, please."},
                {"role": "user", "content": f"Tell me one fact about the number {i * 7 + 3}."}],
                "max_tokens": 10 + i % 4, "temperature": 0}}) + "\n")
        f.write('{"custom_id": "bad", "body": {\n')


class Structure(html.parser.HTMLParser):
    """Tag balance, section titles, and every reference a page could fetch."""

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.h2, self.refs, self.svgs = [], [], [], [], 0
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("src", "href", "srcset", "poster", "data", "action", "xlink:href") or \
                    (v and re.search(r"url\(|@import|https?:", v)):
                self.refs.append(f"<{tag} {k}={v!r}>")
        if tag in ("script", "link", "iframe", "object", "embed", "img"):
            self.refs.append(f"<{tag}>")
        if tag == "svg":
            self.svgs += 1
        if tag == "h2":
            self._in_h2 = True
            self.h2.append("")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID and self.stack and self.stack[-1] == tag:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}>")
            return
        self.stack.pop()

    def handle_data(self, data):
        if self._in_h2:
            self.h2[-1] += data
        if re.search(r"url\(|@import|https?:", data):
            self.refs.append(f"text {data[:60]!r}")


def static_checks(name, page):
    s = Structure()
    s.feed(page)
    s.close()
    check(not s.errors and not s.stack, f"{name}: not well-formed: {s.errors[:3]} open {s.stack[-3:]}")
    check(not s.refs, f"{name}: refers outside itself: {s.refs[:5]}")
    for sec in SECTIONS:
        check(sec in s.h2, f"{name}: no section '{sec}' (has {s.h2})")
    check(s.svgs >= 7, f"{name}: {s.svgs} charts")
    check(not re.search(r"\b(nan|NaN|inf|Infinity)\b", page), f"{name}: a non-finite number in the page")
    return s.svgs


def read_png(path):
    """(width, height, rows of RGB(A) bytes) of an 8-bit non-interlaced PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, = struct.unpack(">I", data[pos:pos + 4])
        typ, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if typ == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or interlace or color not in (2, 6):
                raise ValueError(f"PNG kind {depth}/{color}/{interlace} not handled")
            bpp = 3 if color == 2 else 4
        elif typ == b"IDAT":
            idat += body
    raw, stride, rows, prev, p = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp), 0
    for _ in range(h):
        f, line = raw[p], bytearray(raw[p + 1:p + 1 + stride])
        p += 1 + stride
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                q = a + b - c
                pa, pb, pc = abs(q - a), abs(q - b), abs(q - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append((bytes(line), bpp))
        prev = line
    return w, h, rows


def png_content(path):
    """Share of non-white pixels and number of distinct colours (every 4th pixel)."""
    w, h, rows = read_png(path)
    ink, colours, seen = 0, set(), 0
    for y in range(0, h, 4):
        line, bpp = rows[y]
        for x in range(0, w, 4):
            px = line[x * bpp:x * bpp + 3]
            seen += 1
            colours.add(px)
            if min(px) < 235:
                ink += 1
    return w, h, ink / max(seen, 1), len(colours)


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browse(chrome, page, tmp, shot=None, dump=False):
    """Loads file `page` in headless chromium. Returns (console messages,
    URLs the page asked for, DOM text or None)."""
    profile = tempfile.mkdtemp(dir=tmp)
    netlog = os.path.join(profile, "net.json")
    args = [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-default-apps", "--disable-extensions", f"--user-data-dir={profile}",
            "--enable-logging=stderr", "--v=0", f"--log-net-log={netlog}", f"--window-size={WIDTH},{HEIGHT}"]
    args += [f"--screenshot={shot}"] if shot else []
    args += ["--dump-dom"] if dump else []
    # its own process group, so that a hang takes its helpers down with it
    p = subprocess.Popen(args + ["file://" + os.path.abspath(page)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        check(False, f"chromium did not finish with {page} in 120 s")
    console = [ln for ln in err.splitlines() if ":CONSOLE" in ln]
    fetched = set()
    try:
        with open(netlog) as f:
            log = json.load(f)
        for e in log.get("events", []):
            prm = e.get("params") or {}
            # the page's own requests carry its (opaque file) origin; the
            # browser's background ones say "not an origin"
            if "url" in prm and "initiator" in prm and prm["initiator"] != "not an origin":
                fetched.add(prm["url"])
    except (OSError, ValueError) as e:
        check(False, f"chromium wrote no readable net log for {page}: {e}")
    return console, fetched, (out if dump else None), p.returncode


def main():
    if not ready():
        return 77
    shots = os.environ.get("KVB_REPORT_SHOTS") or os.path.join(os.getcwd(), "report-html")
    os.makedirs(shots, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.jsonl")
        make_job(job)
        dbs = []
        for name, extra in (("roomy", []), ("tight", ["--kv-mem", "4M"])):
            db = os.path.join(tmp, name + ".db")
            p = subprocess.run([BIN, "run", "--model", MODEL, "-i", job, "-o", os.path.join(tmp, name + ".jsonl"),
                                "--metrics", db, "--no-cache", "--ctx", "128", "-q", *extra],
                               capture_output=True, text=True)
            if not check(p.returncode == 0, f"run {name}: {p.stderr}"):
                return finish("report --html")
            dbs.append(db)
        pages = {"single": os.path.join(tmp, "single.html"), "compare": os.path.join(tmp, "compare.html")}
        for name, args in (("single", [dbs[1]]), ("compare", dbs)):
            p = subprocess.run([BIN, "report", *args, "--html", pages[name]], capture_output=True, text=True)
            check(p.returncode == 0 and p.stdout == "", f"report --html {name}: {p.returncode} {p.stderr}")
        svgs = {}
        for name, path in pages.items():
            if not check(os.path.exists(path), f"no page {path}"):
                return finish("report --html")
            page = open(path, encoding="utf-8").read()
            svgs[name] = static_checks(name, page)
        single = open(pages["single"]).read()
        check("preemptions" in single and re.search(r"<b>[1-9]\d*</b>", single[single.find("preemptions"):][:200]),
              "single page: the tight run's preemptions are not shown")
        compare = open(pages["compare"]).read()
        check("roomy.db run 1" in compare and "tight.db run 1" in compare, "compare page: runs not named")
        # --html - writes the same page to stdout
        p = subprocess.run([BIN, "report", dbs[1], "--html", "-"], capture_output=True, text=True)
        check(p.returncode == 0 and p.stdout.startswith("<!DOCTYPE html>") and p.stdout.endswith("</html>\n"),
              "--html - does not write the page to stdout")

        chrome = chromium()
        if not chrome:
            if failures:
                return finish("report --html")
            print("SKIP: no chromium (apt-get install chromium): the pages were checked but not loaded in a browser")
            return 77

        # The detector must see faults first: a bad SVG attribute, a script
        # error, and a fetch from outside.
        broken = os.path.join(tmp, "broken.html")
        with open(broken, "w") as f:
            f.write('<!DOCTYPE html><html><body><svg width="10" height="10"><polyline points="0,0 NaN,1"/>'
                    '</svg><img src="https://example.invalid/x.png"><script>throw new Error("deliberate")</script>'
                    '</body></html>')
        console, fetched, _, _ = browse(chrome, broken, tmp, dump=True)
        check(any("attribute points" in c for c in console) and any("deliberate" in c for c in console),
              f"the detector missed console errors of a broken page: {console}")
        check(any("example.invalid" in u for u in fetched), f"the detector missed a fetch: {fetched}")

        for name, path in pages.items():
            shot = os.path.join(shots, name + ".png")
            if os.path.exists(shot):
                os.unlink(shot)
            console, fetched, _, rc = browse(chrome, path, tmp, shot=shot)
            check(rc == 0, f"{name}: chromium exit {rc}")
            check(not console, f"{name}: console messages: {console}")
            check(not fetched, f"{name}: the page fetched {sorted(fetched)}")
            if check(os.path.exists(shot) and os.path.getsize(shot) > 10000, f"{name}: no screenshot {shot}"):
                w, h, ink, colours = png_content(shot)
                check((w, h) == (WIDTH, HEIGHT), f"{name}: screenshot {w}x{h}")
                check(ink > 0.02 and colours > 20, f"{name}: screenshot looks blank ({ink:.3f} ink, {colours} colours)")
                print(f"screenshot of the {name} page: {shot} ({ink:.1%} ink, {colours} colours)")
            _, _, dom, _ = browse(chrome, path, tmp, dump=True)
            n_svg = len(re.findall(r"<svg\b", dom or ""))
            check(n_svg == svgs[name], f"{name}: {n_svg} charts in the loaded DOM, {svgs[name]} in the page")
            for sec in SECTIONS:
                check(f">{sec}</h2>" in (dom or ""), f"{name}: section '{sec}' missing after load")
    return finish("report --html")


if __name__ == "__main__":
    sys.exit(main())
