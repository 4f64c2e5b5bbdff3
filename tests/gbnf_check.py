"""An independent GBNF checker, written from llama.cpp's grammars/README.md
(not from kvbatch's C): parse a grammar, then say whether a string is a
sentence of it (FULL), a prefix of one (PREFIX) or neither (NONE).

Design, deliberately unlike the C engine's pushdown of byte sets: the
grammar is read into a tree, lowered to a context-free grammar over Unicode
code points (repetitions as fresh right-recursive nonterminals), and strings
are recognised with an Earley parser (which needs no left-recursion rule
and handles nullable symbols by Aycock and Horspool's fix). Also a random
sentence generator for differential tests.

Usage as a tool: python3 gbnf_check.py GRAMMAR.gbnf < lines (each line a
JSON string); prints FULL, PREFIX or NONE per line.
"""
import json
import random
import sys


class GbnfError(ValueError):
    pass


# ---- parsing ----------------------------------------------------------------

def _is_word(c):
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, text):
        self.s = text
        self.i = 0

    def peek(self, k=0):
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def fail(self, what):
        raise GbnfError(f"at offset {self.i}: {what}")

    def space(self, newline_ok):
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t" or (newline_ok and c in "\r\n"):
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] not in "\r\n":
                    self.i += 1
            else:
                break

    def name(self):
        j = self.i
        while _is_word(self.peek()):
            self.i += 1
        if j == self.i:
            self.fail("expecting a name")
        return self.s[j:self.i]

    def char(self):
        c = self.peek()
        if not c:
            self.fail("unexpected end")
        if c != "\\":
            self.i += 1
            return ord(c)
        e = self.peek(1)
        simple = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
        if e in simple:
            self.i += 2
            return simple[e]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width is None:
            self.fail("unknown escape")
        digits = self.s[self.i + 2:self.i + 2 + width]
        if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
            self.fail("bad hex escape")
        self.i += 2 + width
        return int(digits, 16)

    def grammar(self):
        rules = {}
        self.space(True)
        while self.i < len(self.s):
            n = self.name()
            self.space(False)
            if self.s[self.i:self.i + 3] != "::=":
                self.fail("expecting ::=")
            self.i += 3
            self.space(True)
            if n in rules:
                self.fail(f"rule {n} defined twice")
            rules[n] = self.alternates(False)
            c = self.peek()
            if c == "\r":
                self.i += 2 if self.peek(1) == "\n" else 1
            elif c == "\n":
                self.i += 1
            elif c:
                self.fail("expecting a newline")
            self.space(True)
        return rules

    def alternates(self, nested):
        alts = [self.sequence(nested)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            alts.append(self.sequence(nested))
        return ("alt", alts)

    def sequence(self, nested):
        items = []
        while True:
            c = self.peek()
            if c == '"':
                self.i += 1
                cps = []
                while self.peek() != '"':
                    cps.append(self.char())
                self.i += 1
                items.append(("lit", cps))
            elif c == "[":
                self.i += 1
                neg = self.peek() == "^"
                if neg:
                    self.i += 1
                ranges = []
                while self.peek() != "]":
                    lo = self.char()
                    hi = lo
                    if self.peek() == "-" and self.peek(1) not in ("]", ""):
                        self.i += 1
                        hi = self.char()
                    ranges.append((lo, hi))
                self.i += 1
                items.append(("cls", neg, ranges))
            elif c == ".":
                self.i += 1
                items.append(("any",))
            elif c == "(":
                self.i += 1
                self.space(True)
                inner = self.alternates(True)
                if self.peek() != ")":
                    self.fail("expecting )")
                self.i += 1
                items.append(inner)
            elif c and _is_word(c):
                items.append(("ref", self.name()))
            elif c in ("*", "+", "?", "{") and c:
                if not items:
                    self.fail("nothing to repeat")
                self.i += 1
                if c == "*":
                    lo, hi = 0, None
                elif c == "+":
                    lo, hi = 1, None
                elif c == "?":
                    lo, hi = 0, 1
                else:
                    self.space(nested)
                    lo = self.int()
                    self.space(nested)
                    hi = lo
                    if self.peek() == ",":
                        self.i += 1
                        self.space(nested)
                        hi = self.int() if self.peek().isdigit() else None
                        self.space(nested)
                    if self.peek() != "}":
                        self.fail("expecting }")
                    self.i += 1
                items[-1] = ("rep", items[-1], lo, hi)
            else:
                break
            self.space(nested)
        return ("seq", items)

    def int(self):
        j = self.i
        while self.peek().isdigit():
            self.i += 1
        if j == self.i:
            self.fail("expecting a number")
        return int(self.s[j:self.i])


# ---- lowering to a CFG over code points ------------------------------------

class Grammar:
    """rules: nonterminal -> list of alternatives, each a list of symbols;
    a symbol is a str (nonterminal) or a tuple of (lo, hi) code point ranges,
    plus a negation flag: ("T", negated, ranges)."""

    def __init__(self, text):
        tree = _Parser(text).grammar()
        if "root" not in tree:
            raise GbnfError("no root rule")
        self.rules = {}
        self.fresh = 0
        for name, body in tree.items():
            self.rules[name] = self._alts(body)
        for alts in list(self.rules.values()):
            for alt in alts:
                for sym in alt:
                    if isinstance(sym, str) and sym not in self.rules:
                        raise GbnfError(f"undefined rule {sym}")
        self._nullable()

    def _new(self, alts):
        self.fresh += 1
        name = f" g{self.fresh}"  # a space: no GBNF name collides
        self.rules[name] = alts
        return name

    def _alts(self, node):
        if node[0] == "alt":
            return [self._seq(s) for s in node[1]]
        return [self._seq(("seq", [node]))]

    def _seq(self, node):
        out = []
        for it in node[1]:
            out.extend(self._item(it))
        return out

    def _item(self, it):
        kind = it[0]
        if kind == "lit":
            return [("T", False, ((c, c),)) for c in it[1]]
        if kind == "cls":
            return [("T", it[1], tuple(it[2]))]
        if kind == "any":
            return [("T", False, ((0, 0x10FFFF),))]
        if kind == "ref":
            return [it[1]]
        if kind == "alt":
            return [self._new(self._alts(it))]
        if kind == "rep":
            _, sub, lo, hi = it
            x = self._new(self._alts(sub) if sub[0] == "alt" else [self._item(sub)])
            out = [x] * lo
            if hi is None:
                star = self._new([])
                self.rules[star] = [[], [x, star]]
                out.append(star)
            else:
                tail = None
                for _ in range(hi - lo):  # opt_k ::= "" | x opt_{k-1}
                    tail = self._new([[], [x] + ([tail] if tail else [])])
                if tail:
                    out.append(tail)
            return out
        raise AssertionError(kind)

    def _nullable(self):
        self.null = set()
        changed = True
        while changed:
            changed = False
            for n, alts in self.rules.items():
                if n not in self.null and any(all(isinstance(s, str) and s in self.null for s in a) for a in alts):
                    self.null.add(n)
                    changed = True

    @staticmethod
    def term_matches(sym, cp):
        inside = any(lo <= cp <= hi for lo, hi in sym[2])
        return inside != sym[1]

    # ---- Earley ----

    def check(self, text):
        """FULL, PREFIX or NONE for the code points of text (a str)."""
        rules = self.rules
        chart = [set()]
        start = [("root", i, 0, 0) for i in range(len(rules["root"]))]
        self._closure(chart, 0, start)
        for pos, ch in enumerate(text):
            cp = ord(ch)
            nxt = []
            for (n, a, d, o) in chart[pos]:
                alt = rules[n][a]
                if d < len(alt) and not isinstance(alt[d], str) and self.term_matches(alt[d], cp):
                    nxt.append((n, a, d + 1, o))
            chart.append(set())
            if not nxt:
                return "NONE"
            self._closure(chart, pos + 1, nxt)
        end = chart[len(text)]
        for (n, a, d, o) in end:
            if n == "root" and o == 0 and d == len(rules[n][a]):
                return "FULL"
        return "PREFIX" if any(d < len(rules[n][a]) and not isinstance(rules[n][a][d], str)
                               for (n, a, d, o) in end) else "NONE"

    def _closure(self, chart, k, items):
        rules = self.rules
        S = chart[k]
        work = list(items)
        while work:
            it = work.pop()
            if it in S:
                continue
            S.add(it)
            n, a, d, o = it
            alt = rules[n][a]
            if d < len(alt):
                sym = alt[d]
                if isinstance(sym, str):  # predict
                    for i in range(len(rules[sym])):
                        work.append((sym, i, 0, k))
                    if sym in self.null:
                        work.append((n, a, d + 1, o))
            else:  # complete
                for (n2, a2, d2, o2) in list(chart[o]):
                    alt2 = rules[n2][a2]
                    if d2 < len(alt2) and alt2[d2] == n:
                        work.append((n2, a2, d2 + 1, o2))
                if o == k:  # items added to this same set later are handled by the nullable shortcut
                    pass

    # ---- random sentences ----

    def sample(self, rng, budget=60):
        """A random sentence (str), derivations cut short when the budget runs out; None if stuck."""
        out = []
        self._steps = 0

        def gen(sym, depth):
            self._steps += 1
            if self._steps > 20000:
                raise RecursionError
            if not isinstance(sym, str):
                ranges = sym[2]
                if sym[1]:  # negated: try a few code points
                    for _ in range(50):
                        cp = rng.choice([rng.randrange(32, 127), rng.randrange(0xA0, 0x800), rng.randrange(0x3040, 0x30FF)])
                        if self.term_matches(sym, cp):
                            out.append(chr(cp))
                            return
                    raise RecursionError
                lo, hi = rng.choice(ranges)
                hi = min(hi, 0x10FFFF)
                cp = rng.randint(lo, hi)
                if 0xD800 <= cp <= 0xDFFF:
                    cp = lo
                out.append(chr(cp))
                return
            alts = self.rules[sym]
            if depth > budget:  # prefer the shortest-looking alternative
                alt = min(alts, key=len)
            else:
                alt = rng.choice(alts)
            for s in alt:
                gen(s, depth + 1)

        try:
            gen("root", 0)
        except RecursionError:
            return None
        return "".join(out)


def main():
    g = Grammar(open(sys.argv[1], encoding="utf-8").read())
    for line in sys.stdin:
        print(g.check(json.loads(line)))


if __name__ == "__main__":
    main()
