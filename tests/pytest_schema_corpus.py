#!/usr/bin/env python3
"""The JSON Schema corpus: schemas Pydantic writes for the models below,
hand-written edge cases, and refusals, each compiled to GBNF by kvbatch
(build/test_grammar_schema --schema, the same code the server runs).

For every accepted schema, documents are drawn at random from the schema by
a generator written here, written the ways JSON mode allows (compact,
spaced, indented with spaces or tabs, a leading space), and mutated. The
Python `jsonschema` package is the independent judge: every document it
calls valid must be accepted whole, byte by byte with every prefix alive;
every document it calls invalid (or that is not JSON) must not be accepted
whole. The grammar may be stricter than JSON Schema where kvbatch says so
(whitespace, property order in large objects, no added keys unless
additionalProperties allows them, one written form inside patterned
strings): those are counted, not failed. Each refusal must name its keyword.

The GBNF is run by the engines that are there: kvbatch's own (grammar.h,
through test_grammar_schema --check) and llama.cpp's GBNF recogniser
($KVB_GBNF_VALIDATOR: a program taking GRAMMAR INPUTS with one hex line per
input, printing full / prefix / reject N; tests/README or the report says
how it was built). Skips (77) when neither is."""
import datetime
import enum
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import uuid
from typing import Dict, List, Literal, Optional, Tuple, Union

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvbcheck  # noqa: E402

kvbcheck.need_modules("pydantic", "jsonschema")
import jsonschema  # noqa: E402
from pydantic import BaseModel, Field, conint, constr  # noqa: E402
from typing_extensions import Annotated  # noqa: E402

check = kvbcheck.check
BIN = os.environ.get("KVB_BIN") or os.path.join(kvbcheck.SRC, "build", "kvbatch")
TOOL = os.path.join(os.path.dirname(BIN), "test_grammar_schema")

# ---- the Pydantic models ------------------------------------------------------------------


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Level(int, enum.Enum):
    low = 1
    mid = 2
    high = 3


class Address(BaseModel):
    street: str
    city: str
    zip: Annotated[str, Field(pattern=r"^\d{5}(-\d{4})?$")]
    country: str = "US"


class Person(BaseModel):
    name: str
    age: Annotated[int, Field(ge=0, le=150)]
    email: Optional[Annotated[str, Field(json_schema_extra={"format": "email"})]] = None
    address: Optional[Address] = None


class Company(BaseModel):
    name: Annotated[str, Field(min_length=1, max_length=80)]
    founded: Optional[Annotated[int, Field(ge=1800, le=2100)]] = None
    employees: List[Person] = Field(default_factory=list, max_length=5)
    tags: List[constr(pattern=r"^[a-z][a-z0-9-]*$", max_length=20)] = []


class Node(BaseModel):
    value: int
    children: List["Node"] = []


class LinkedItem(BaseModel):
    label: str
    next: Optional["LinkedItem"] = None


class Event(BaseModel):
    id: uuid.UUID
    at: datetime.datetime
    day: datetime.date
    start: datetime.time


class Shape(BaseModel):
    kind: Literal["circle", "square"]
    size: Annotated[float, Field(gt=0, le=100)]
    color: Color = Color.red


class Rating(BaseModel):
    score: conint(ge=1, le=5)
    level: Level
    note: Optional[constr(max_length=40)] = None


class Point(BaseModel):
    xy: Tuple[int, int]
    label: Tuple[str, float, bool]


class Inventory(BaseModel):
    counts: Dict[str, conint(ge=0)]
    prices: Dict[str, float] = {}


class Cat(BaseModel):
    pet_type: Literal["cat"]
    meows: int


class Dog(BaseModel):
    pet_type: Literal["dog"]
    barks: float


class Owner(BaseModel):
    pet: Union[Cat, Dog] = Field(discriminator="pet_type")
    name: str


class Flags(BaseModel):
    a: bool
    b: Optional[bool] = None
    c: Union[int, str, None] = None


class Wide(BaseModel):  # more properties than the any-order limit: held in order
    f01: str
    f02: Optional[int] = None
    f03: str
    f04: Optional[bool] = None
    f05: Optional[str] = None
    f06: int
    f07: Optional[float] = None
    f08: Optional[str] = None
    f09: str
    f10: Optional[List[int]] = None
    f11: Optional[str] = None


class Network(BaseModel):
    v4: Annotated[str, Field(json_schema_extra={"format": "ipv4"})]
    v6: Optional[Annotated[str, Field(json_schema_extra={"format": "ipv6"})]] = None
    home: Annotated[str, Field(json_schema_extra={"format": "uri"}, max_length=60)]


class Measurement(BaseModel):
    temp: Annotated[float, Field(ge=-50, le=60)]
    ratio: Annotated[float, Field(ge=0, le=1)]
    delta: Annotated[int, Field(gt=-10, lt=10)]
    big: Annotated[int, Field(ge=1000000)]
    neg: Annotated[int, Field(le=-5)]


class Pricing(BaseModel):
    price: Annotated[float, Field(gt=0.01, le=999.99)]
    discount: Annotated[float, Field(ge=0, lt=0.5)] = 0
    rate: Optional[Annotated[float, Field(ge=-2.25, le=-0.75)]] = None


class Tree(BaseModel):
    name: str
    left: Optional["Tree"] = None
    right: Optional["Tree"] = None


class Matrix(BaseModel):
    rows: Annotated[List[Annotated[List[int], Field(min_length=2, max_length=3)]], Field(min_length=1, max_length=3)]


class Article(BaseModel):
    title: Annotated[str, Field(min_length=3, max_length=60)]
    slug: Annotated[str, Field(pattern=r"^[a-z0-9]+(?:-[a-z0-9]+)*$", min_length=3, max_length=40)]
    published: Optional[datetime.date] = None
    authors: Annotated[List[Person], Field(min_length=1, max_length=2)]


class Extraction(BaseModel):
    people: List[Person] = []
    companies: List[Company] = []
    summary: Annotated[str, Field(max_length=200)]


class Code(BaseModel):
    sku: Annotated[str, Field(pattern=r"^[A-Z]{3}-\d{4}$")]
    hexcolor: Annotated[str, Field(pattern=r"^#[0-9a-fA-F]{6}$")]
    phone: Annotated[str, Field(pattern=r"^\+?[0-9 ()-]{7,15}$")]


class Contains(BaseModel):
    word: Annotated[str, Field(pattern=r"ab+c")]  # unanchored: contains a match
    ends: Annotated[str, Field(pattern=r"\.json$")]


class Nested3(BaseModel):
    a: Dict[str, Dict[str, List[int]]]


class Review(BaseModel):
    stars: Literal[1, 2, 3, 4, 5]
    verdict: Literal["yes", "no", "maybe"]
    fixed: Literal["v1"]


class Mixed(BaseModel):
    anything: object = None
    maybe_list: Optional[List[str]] = None
    choice: Union[Shape, Rating, None] = None


class Ids(BaseModel):
    ids: Annotated[List[uuid.UUID], Field(min_length=1, max_length=3)]


class Doc(BaseModel):
    text: str
    meta: Dict[str, Union[str, int, bool]] = {}


class ExtraAllowed(BaseModel, extra="allow"):
    known: int


class Forbid(BaseModel, extra="forbid"):
    x: int
    y: Optional[str] = None


class Employee(Person):  # inheritance
    company: Company
    role: Literal["eng", "sales", "ops"]


MODELS = [Address, Person, Company, Node, LinkedItem, Event, Shape, Rating, Point, Inventory, Owner, Flags, Wide,
          Network, Measurement, Pricing, Tree, Matrix, Article, Extraction, Code, Contains, Nested3, Review, Mixed, Ids, Doc,
          ExtraAllowed, Forbid, Employee]

# ---- hand-written schemas -------------------------------------------------------------------

HAND = {
    "empty-object": {"type": "object"},
    "only-empty": {"type": "object", "additionalProperties": False},
    "true-props": {"type": "object", "properties": {"a": True, "b": {}}, "required": ["a"]},
    "type-list": {"type": "object", "properties": {"v": {"type": ["string", "integer", "null", "array"]}},
                  "required": ["v"]},
    "enum-any": {"type": "object", "properties": {"e": {"enum": ["x", 1, 2.5, None, True, [1, "a"], {"k": "v"}]}},
                 "required": ["e"]},
    "const-object": {"type": "object", "properties": {"c": {"const": {"a": [1, 2], "b": None}}}, "required": ["c"]},
    "allof-merge": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                              {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    "ref-siblings": {"$defs": {"S": {"type": "string", "maxLength": 5}},
                     "type": "object", "properties": {"s": {"$ref": "#/$defs/S", "minLength": 2}},
                     "required": ["s"]},
    "definitions": {"definitions": {"I": {"type": "integer", "minimum": -3, "maximum": 3}},
                    "type": "object", "properties": {"i": {"$ref": "#/definitions/I"}}, "required": ["i"]},
    "root-ref": {"type": "object", "properties": {"self": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
                                                  "n": {"type": "integer"}}, "required": ["n"]},
    "anyof-distribute": {"type": "object", "properties": {
        "v": {"type": "string", "anyOf": [{"minLength": 3, "maxLength": 4}, {"pattern": "^z+$"}]}},
        "required": ["v"]},
    "prefix-items-open": {"type": "object", "properties": {
        "t": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}],
              "items": {"type": "string"}, "maxItems": 4}}, "required": ["t"]},
    "prefix-items-closed": {"type": "object", "properties": {
        "t": {"type": "array", "prefixItems": [{"const": 1}, {"const": 2}], "items": False}}, "required": ["t"]},
    "array-counts": {"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
        "b": {"type": "array", "minItems": 1}}, "required": ["a", "b"]},
    "escaped-names": {"type": "object", "properties": {"quote\"d": {"type": "integer"}, "tab\tx": {"type": "null"},
                                                       "caf\u00e9": {"type": "boolean"}},
                      "required": ["quote\"d", "caf\u00e9"]},
    "addl-schema-with-props": {"type": "object", "properties": {"id": {"type": "integer"}},
                               "additionalProperties": {"type": "string", "maxLength": 3}, "required": ["id"]},
    "pattern-escapes": {"type": "object", "properties": {"q": {"type": "string", "pattern": "^[\"\\\\/a]{1,4}$"},
                                                         "nl": {"type": "string", "pattern": "^a\\nb$"}},
                        "required": ["q", "nl"]},
    "pattern-alt-anchors": {"type": "object", "properties": {"p": {"type": "string", "pattern": "^ab|cd$"}},
                            "required": ["p"]},
    "pattern-classes": {"type": "object", "properties": {
        "w": {"type": "string", "pattern": "^\\w+\\s\\d{2,3}[^a-z]?$"},
        "dot": {"type": "string", "pattern": "^.{2}$"}}, "required": ["w", "dot"]},
    "lengths-unicode": {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 3}},
                        "required": ["s"]},
    "int-ranges": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -120, "maximum": 1234},
        "b": {"type": "integer", "exclusiveMinimum": 99, "exclusiveMaximum": 1000},
        "c": {"type": "integer", "maximum": -1000},
        "d": {"type": "integer", "minimum": 7}}, "required": ["a", "b", "c", "d"]},
    "num-ranges": {"type": "object", "properties": {
        "a": {"type": "number", "minimum": -2, "maximum": 3},
        "b": {"type": "number", "exclusiveMinimum": 0},
        "c": {"type": "number", "exclusiveMaximum": 0},
        "d": {"type": "number", "minimum": 10, "exclusiveMaximum": 11}}, "required": ["a", "b", "c", "d"]},
    "draft4-exclusive": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 3}}, "required": ["a"]},
    "formats": {"type": "object", "properties": {
        "d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "time"},
        "dt": {"type": "string", "format": "date-time"}, "u": {"type": "string", "format": "uuid"},
        "e": {"type": "string", "format": "email", "maxLength": 30}},
        "required": ["d", "t", "dt", "u", "e"]},
    "oneof-root": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
         "required": ["kind", "y"]}]},
    "deep-free": {"type": "object", "properties": {"free": {}}, "required": ["free"]},
    "nine-required": {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdefghi"},
                      "required": list("abcdefghi")},
    "zod-draft7-tuple": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {
        "pair": {"type": "array", "items": [{"type": "string"}, {"type": "number", "exclusiveMinimum": 0}],
                 "minItems": 2, "maxItems": 2, "additionalItems": False},
        "rest": {"type": "array", "items": [{"type": "boolean"}], "additionalItems": {"type": "integer"}},
        "when": {"type": "string", "format": "date-time"},
        "same": {"$ref": "#/properties/pair"}},
        "required": ["pair", "rest"], "additionalProperties": False},
    "enum-escaped": {"type": "object", "properties": {"drink": {"enum": ["caf\u00e9", "th\u00e9", "\"q\"", "a\\b"]},
                                                      "k": {"const": "\u4e2d\u6587"}},
                     "required": ["drink", "k"]},
    "mutual-recursion": {"$defs": {
        "A": {"type": "object", "properties": {"b": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "null"}]}}},
        "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}, "n": {"type": "integer"}},
              "required": ["a"]}}, "$ref": "#/$defs/A"},
}

# Refusals: each must fail to compile with a message naming the keyword.
REFUSED = {
    "multipleOf": {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 5}}},
    "uniqueItems": {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
    "patternProperties": {"type": "object", "patternProperties": {"^s_": {"type": "string"}}},
    "lookahead": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?!x)"}}},
    "back-reference": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a)\\1"}}},
    "format 'hostname'": {"type": "object", "properties": {"a": {"type": "string", "format": "hostname"}}},
    "must describe an object": {"type": "array"},
    "too many digits": {"type": "object", "properties": {"a": {"type": "number", "maximum": 2.5e-80}}},
    "'not'": {"type": "object", "properties": {"a": {"not": {}}}},
    "only references inside": {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}},
    "format beside pattern": {"type": "object",
                              "properties": {"a": {"type": "string", "format": "uuid", "pattern": "^a"}}},
    "minProperties": {"type": "object", "minProperties": 2},
    "'if'": {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    "maxLength": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 100000}}},
}


# ---- a document generator -------------------------------------------------------------------

POOL = list("abcxyzABZ0129 _-.,:;/\\\"'!?#@+()[]{}") + ["\n", "\t", "\u00e9", "\u4e2d", "\U0001F600", "\u00a0"]


class Gen:
    def __init__(self, root, rng):
        self.root, self.rng = root, rng

    def resolve(self, ref):
        assert ref.startswith("#")
        node = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    def merge(self, s):
        """allOf and $ref folded into one dict (properties united, required united)."""
        if s is True or s is None:
            return {}
        s = dict(s)
        parts = []
        if "$ref" in s:
            parts.append(self.resolve(s.pop("$ref")))
        parts += s.pop("allOf", [])
        for p in parts:
            p = self.merge(p)
            for k, v in p.items():
                if k == "properties":
                    s["properties"] = {**s.get("properties", {}), **v}
                elif k == "required":
                    s["required"] = list(dict.fromkeys(s.get("required", []) + v))
                elif k == "type" and "type" in s:
                    a = s["type"] if isinstance(s["type"], list) else [s["type"]]
                    b = v if isinstance(v, list) else [v]
                    s["type"] = [t for t in a if t in b or (t == "integer" and "number" in b)] + \
                                [t for t in b if t == "integer" and "number" in a and t not in a]
                elif k not in s:
                    s[k] = v
        return s

    def value(self, s, depth=0):
        s = self.merge(s)
        r = self.rng
        for key in ("anyOf", "oneOf"):
            if key in s:
                rest = {k: v for k, v in s.items() if k != key}
                branch = self.merge(r.choice(s[key]))
                return self.value({**rest, **branch, **({"allOf": [rest]} if rest else {})}, depth)
        if "const" in s:
            return s["const"]
        if "enum" in s:
            return r.choice(s["enum"])
        t = s.get("type")
        if t is None:
            if any(k in s for k in ("properties", "required", "additionalProperties")):
                t = "object"
            elif any(k in s for k in ("items", "prefixItems", "minItems", "maxItems")):
                t = "array"
            elif any(k in s for k in ("pattern", "format", "minLength", "maxLength")):
                t = "string"
            elif any(k in s for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
                t = "number"
            else:
                return self.free(depth)
        if isinstance(t, list):
            t = r.choice(t)
        return getattr(self, "g_" + t)(s, depth)

    def free(self, depth):
        r = self.rng
        k = r.randrange(7 if depth < 4 else 5)
        if k == 0:
            return None
        if k == 1:
            return r.choice([True, False])
        if k == 2:
            return r.randint(-1000, 1000)
        if k == 3:
            return round(r.uniform(-100, 100), 3)
        if k == 4:
            return self.rstring(0, 6)
        if k == 5:
            return [self.free(depth + 1) for _ in range(r.randrange(3))]
        return {self.rstring(1, 5): self.free(depth + 1) for _ in range(r.randrange(3))}

    def rstring(self, lo, hi):
        return "".join(self.rng.choice(POOL) for _ in range(self.rng.randint(lo, hi)))

    def g_null(self, s, d):
        return None

    def g_boolean(self, s, d):
        return self.rng.choice([True, False])

    def bounds(self, s, integer):
        lo, hi = s.get("minimum"), s.get("maximum")
        xlo, xhi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        if xlo is True:
            xlo, lo = lo, None
        if xhi is True:
            xhi, hi = hi, None
        if xlo is False:
            xlo = None
        if xhi is False:
            xhi = None
        return lo, hi, xlo, xhi

    def g_integer(self, s, d):
        lo, hi, xlo, xhi = self.bounds(s, True)
        a = max([x for x in (lo, None if xlo is None else xlo + 1) if x is not None], default=None)
        b = min([x for x in (hi, None if xhi is None else xhi - 1) if x is not None], default=None)
        a = int(-(-a // 1)) if a is not None else (b - 1000 if b is not None else -1000)
        b = int(b // 1) if b is not None else a + 100000
        if self.rng.random() < 0.3:
            return self.rng.choice([a, b])
        return self.rng.randint(a, b)

    def g_number(self, s, d):
        if self.rng.random() < 0.3 and "minimum" not in s and "exclusiveMinimum" not in s:
            return self.g_integer(s, d)
        lo, hi, xlo, xhi = self.bounds(s, False)
        a = max([x for x in (lo, xlo) if x is not None], default=-1e4)
        b = min([x for x in (hi, xhi) if x is not None], default=a + 1e4)
        for _ in range(50):
            v = round(self.rng.uniform(a, b), self.rng.choice([0, 1, 3]))
            if (lo is None or v >= lo) and (hi is None or v <= hi) and (xlo is None or v > xlo) and \
                    (xhi is None or v < xhi):
                return v
        return (a + b) / 2

    def g_string(self, s, d):
        lo, hi = s.get("minLength", 0), s.get("maxLength", None)
        pat = s.get("pattern") or FORMAT_RE.get(s.get("format"))
        for _ in range(200):
            if pat:
                v = regex_sample(pat, self.rng, search="format" not in s)
            else:
                v = self.rstring(lo, hi if hi is not None else lo + 8)
            if len(v) >= lo and (hi is None or len(v) <= hi):
                return v
        return None  # jsonschema will say so: the document is dropped

    def g_array(self, s, d):
        r = self.rng
        pre = s.get("prefixItems", [])
        items = s.get("items", True)
        if isinstance(items, list):  # draft 4-7 tuples
            pre, items = items, s.get("additionalItems", True)
        lo, hi = s.get("minItems", 0), s.get("maxItems", None)
        cap = len(pre) if items is False else 10 ** 6
        if hi is not None:
            cap = min(cap, hi)
        n = r.randint(min(lo, cap), min(cap, max(lo, len(pre)) + 2))
        return [self.value(pre[i], d + 1) if i < len(pre) else self.value(items, d + 1) for i in range(n)]

    def g_object(self, s, d):
        r = self.rng
        props = s.get("properties", {})
        req = set(s.get("required", []))
        names = [k for k in props if k in req or r.random() < 0.6]
        if len(props) <= 8:
            r.shuffle(names)
        out = {k: self.value(props[k], d + 1) for k in names}
        addl = s.get("additionalProperties", None if props else True)
        if addl not in (None, False) and r.random() < 0.5:
            for _ in range(r.randint(1, 2)):
                k = "".join(r.choice("qrstuvw") for _ in range(r.randint(1, 4)))
                if k not in props:
                    out[k] = self.value(addl, d + 1) if addl is not True else self.free(d + 1)
        return out


FORMAT_RE = {
    "date": r"^(?:20[0-4]\d|19\d\d)-(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])$",
    "time": r"^(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,3})?(?:Z|[+-](?:0\d|1[0-4]):[0-5]\d)$",
    "date-time": r"^20[0-4]\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?"
                 r"(?:Z|[+-](?:0\d|1[0-4]):[0-5]\d)$",
    "email": r"^[a-z0-9_%+-]{1,8}(?:\.[a-z0-9_+-]{1,3})?@[a-z0-9]{1,6}(?:-[a-z0-9]{1,4})?\.(?:com|org|io|de)$",
    "uuid": r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-fA-F]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    "uri": r"^(?:https?|ftp|urn):(?://)?[a-z0-9.-]{1,12}(?:/[a-zA-Z0-9._~-]{0,8}|/%[0-9A-F]{2}){0,3}(?:\?[a-z]=[0-9]{1,3})?$",
    "ipv4": r"^(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$",
    "ipv6": r"^(?:[0-9a-f]{1,4}:){7}[0-9a-f]{1,4}$|^::1$|^fe80::[0-9a-f]{1,4}$|^(?:[0-9a-f]{1,4}:){1,3}:$",
}


def regex_sample(pattern, rng, search=True):
    """A random string the pattern matches (Python's own parser walks it);
    with search semantics, random text around it unless anchored."""
    try:
        import re._parser as sre_parse
        import re._constants as C
    except ImportError:  # older Pythons
        import sre_parse
        import sre_constants as C
    tree = sre_parse.parse(pattern)

    def pick_class(items):
        neg = any(op == C.NEGATE for op, _ in items)
        for _ in range(200):
            c = rng.choice(POOL) if neg or rng.random() < 0.3 else None
            if c is None:
                op, av = rng.choice([i for i in items if i[0] != C.NEGATE])
                if op == C.LITERAL:
                    return chr(av)
                if op == C.RANGE:
                    return chr(rng.randint(av[0], av[1]))
                c = rng.choice(POOL)
            if bool(re.fullmatch(pattern_of(items), c)):
                return c
        return "a"

    def pattern_of(items):
        # rebuilt as a Python class to test membership
        parts = []
        neg = ""
        for op, av in items:
            if op == C.NEGATE:
                neg = "^"
            elif op == C.LITERAL:
                parts.append(re.escape(chr(av)))
            elif op == C.RANGE:
                parts.append(re.escape(chr(av[0])) + "-" + re.escape(chr(av[1])))
            elif op == C.CATEGORY:
                parts.append({C.CATEGORY_DIGIT: r"0-9", C.CATEGORY_WORD: r"A-Za-z0-9_",
                              C.CATEGORY_SPACE: r"\s", C.CATEGORY_NOT_DIGIT: r"\D",
                              C.CATEGORY_NOT_WORD: r"\W", C.CATEGORY_NOT_SPACE: r"\S"}[av])
        return "[" + neg + "".join(parts) + "]"

    def walk(seq):
        out = []
        for op, av in seq:
            if op == C.LITERAL:
                out.append(chr(av))
            elif op == C.NOT_LITERAL:
                out.append(rng.choice([c for c in POOL if c != chr(av) and c != "\n"]))
            elif op == C.ANY:
                out.append(rng.choice([c for c in POOL if c != "\n"]))
            elif op == C.IN:
                out.append(pick_class(av))
            elif op == C.BRANCH:
                out.append(walk(rng.choice(av[1])))
            elif op == C.SUBPATTERN:
                out.append(walk(av[-1]))
            elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
                lo, hi, sub = av
                hi = min(hi, lo + 3) if hi != C.MAXREPEAT else lo + 3
                out.append("".join(walk(sub) for _ in range(rng.randint(lo, hi))))
            elif op == C.AT:
                pass
            elif op == C.CATEGORY:
                out.append(pick_class([(op, av)]))
            else:
                raise ValueError("generator: no %s" % op)
        return "".join(out)

    core = walk(tree)
    if search:
        if not pattern.startswith("^") and rng.random() < 0.5:
            core = "".join(rng.choice(POOL) for _ in range(rng.randint(1, 3))) + core
        if not pattern.endswith("$") and rng.random() < 0.5:
            core += "".join(rng.choice(POOL) for _ in range(rng.randint(1, 3)))
    return core


def writings(doc, rng):
    """The same document written the ways JSON mode allows."""
    out = [json.dumps(doc, ensure_ascii=False, separators=(",", ":")),
           json.dumps(doc, ensure_ascii=False),
           json.dumps(doc, ensure_ascii=False, indent=2)]
    t = json.dumps(doc, ensure_ascii=False, indent="\t")
    out.append((" " if rng.random() < 0.5 else "\n") + t)
    return [w for w in out if max((len(m) for m in re.findall(r"\n[ \t]*", w)), default=0) <= 25]


def text_mutations(text, rng, n):
    out = []
    for _ in range(n):
        k = rng.randrange(6)
        i = rng.randrange(len(text) + 1)
        if k == 0 and text:
            m = text[:i] + text[i + 1:]
        elif k == 1:
            m = text[:i] + rng.choice(POOL + ['"', "}", "]", ",", "1", "-", "e", "."]) + text[i:]
        elif k == 2:
            m = text + rng.choice(["}", " ", "\n", "x", ","])
        elif k == 3:
            m = text.replace(":", ":  ", 1)
        elif k == 4:
            m = text.replace(",", ",\r\n", 1)
        else:
            m = text[:i] + text[i:].replace("\"", "'", 1)
        out.append(m)
    return out


def semantic_mutations(doc, schema, gen, rng):
    """Documents close to doc that the schema may refuse."""
    out = []
    if isinstance(doc, dict) and doc:
        k = rng.choice(list(doc))
        d = dict(doc)
        del d[k]
        out.append(d)
        for bad in ([1, 2], "s", 12345678, -1, None, True, {"z": 1}, 1.5, "", "x" * 90):
            d = dict(doc)
            d[k] = bad
            out.append(d)
        d = dict(doc)
        d["zz_extra"] = 1
        out.append(d)
    # one level deeper
    for k, v in (doc.items() if isinstance(doc, dict) else []):
        if isinstance(v, (dict, list)) and v:
            for m in semantic_mutations(v, None, gen, rng)[:6]:
                d = dict(doc)
                d[k] = m
                out.append(d)
        if isinstance(v, list):
            d = dict(doc)
            d[k] = v + v[:1] * 6 if v else [1]
            out.append(d)
        if isinstance(v, str):
            d = dict(doc)
            d[k] = v + "!"
            out.append(d)
            d = dict(doc)
            d[k] = v[:-1]
            out.append(d)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            for delta in (1, -1, 1000000, 0.5):
                d = dict(doc)
                d[k] = v + delta
                out.append(d)
    if isinstance(doc, list) and doc:
        out.append(doc[1:])
        out.append(doc + doc[:1])
        out.append([{"x": 1}] + doc[1:])
    return out


# ---- running --------------------------------------------------------------------------------

def to_gbnf(schema, tmp):
    p = os.path.join(tmp, "schema.json")
    with open(p, "w") as f:
        json.dump(schema, f)
    r = subprocess.run([TOOL, "--schema", p], capture_output=True, text=True, timeout=60)
    if r.returncode == 3:
        return None, r.stdout.strip()
    if r.returncode != 0:
        return None, "tool failed: rc %d %s" % (r.returncode, r.stderr[-300:])
    return r.stdout, None


def engines(tmp):
    """(name, command prefix) of each GBNF engine present."""
    out = []
    probe_g = os.path.join(tmp, "probe.gbnf")
    probe_i = os.path.join(tmp, "probe.txt")
    with open(probe_g, "w") as f:
        f.write('root ::= "a"\n')
    with open(probe_i, "w") as f:
        f.write("61\n")
    r = subprocess.run([TOOL, "--check", probe_g, probe_i], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip() == "full":
        out.append(("kvbatch", [TOOL, "--check"]))
    llama = os.environ.get("KVB_GBNF_VALIDATOR")
    if llama and os.access(llama, os.X_OK):
        out.append(("llama.cpp", [llama]))
    return out


def run_engine(cmd, gbnf, texts, tmp):
    g = os.path.join(tmp, "g.gbnf")
    i = os.path.join(tmp, "in.txt")
    with open(g, "w") as f:
        f.write(gbnf)
    with open(i, "w") as f:
        for t in texts:
            f.write(t.encode().hex() + "\n")
    r = subprocess.run(cmd + [g, i], capture_output=True, text=True, timeout=300)
    lines = r.stdout.split("\n")
    if r.returncode != 0 or len(lines) < len(texts):
        return None, (r.stdout + r.stderr)[-400:]
    return lines[:len(texts)], None


def run_jobs(tmp, lines):
    inp, out = os.path.join(tmp, "jobs.jsonl"), os.path.join(tmp, "out.jsonl")
    with open(inp, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    r = subprocess.run([BIN, "run", "--model", kvbcheck.MODEL, "--quiet", "--no-cache", "-i", inp, "-o", out,
                        "--metrics", os.path.join(tmp, "m.db")], capture_output=True, text=True, timeout=900)
    if not check(r.returncode == 0, "kvbatch run: rc %d: %s" % (r.returncode, r.stderr[-600:])):
        return {}
    res = {}
    for line in open(out, encoding="utf-8"):
        o = json.loads(line)
        res[o["custom_id"]] = o
    return res


def sampled(accepted, tmp, seeds=2, max_tokens=160):
    """(d) Each accepted schema on the default model at a few seeds, all in
    one batch: outputs that stop must validate, outputs cut by max_tokens
    must be prefixes of the grammar."""
    lines, want = [], {}
    for i, (name, schema, gbnf) in enumerate(accepted):
        for seed in range(seeds):
            cid = "s%d-%d" % (i, seed)
            body = {"messages": [{"role": "user", "content": "Give an example JSON object for this schema: "
                                  + json.dumps(schema)[:1500]}],
                    "max_tokens": max_tokens, "temperature": [0.7, 1.0, 0.0][seed % 3], "seed": seed,
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "s%d" % i, "schema": schema}}}
            lines.append({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
            want[cid] = (name, schema, gbnf)
    res = run_jobs(tmp, lines)
    n_stop = n_len = n_err = 0
    for cid, (name, schema, gbnf) in want.items():
        o = res.get(cid)
        if not check(o is not None, "%s: no output line" % cid):
            continue
        if o.get("error") or (o.get("response") or {}).get("status_code", 200) != 200:
            n_err += 1
            check(False, "%s (%s): refused by kvbatch: %s" % (cid, name, json.dumps(o)[:400]))
            continue
        c = o["response"]["body"]["choices"][0]
        text, fr = c["message"]["content"], c["finish_reason"]
        if fr == "stop":
            n_stop += 1
            try:
                doc = json.loads(text)
            except ValueError:
                check(False, "%s (%s): stopped output is not JSON: %r" % (cid, name, text[:300]))
                continue
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            errs = [e.message for e in cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(doc)]
            check(not errs, "%s (%s): stopped output invalid (%s): %r" % (cid, name, errs[:2], text[:300]))
        else:
            n_len += 1
            check(fr == "length", "%s: finish_reason %s" % (cid, fr))
            r, why = run_engine([TOOL, "--check"], gbnf, [text], tmp)
            check(r is not None and r[0] in ("prefix", "full"),
                  "%s (%s): cut output is not a prefix (%s): %r" % (cid, name, r or why, text[:300]))
    print("sampled: %d requests, %d stopped (valid by jsonschema), %d cut by max_tokens (prefixes), %d refused"
          % (len(want), n_stop, n_len, n_err))
    check(n_stop >= len(want) // 4, "too few sampled outputs reached the end of their schema")


def main():
    if not os.path.exists(TOOL):
        print("SKIP: %s not built" % TOOL)
        return 77
    rng = random.Random(int(os.environ.get("KVB_SEED", "1234")))
    corpus = [("pydantic:" + m.__name__, m.model_json_schema()) for m in MODELS]
    corpus += [("hand:" + k, v) for k, v in HAND.items()]
    stats = dict(schemas=len(corpus) + len(REFUSED), accepted=0, refused=0, valid=0, invalid=0, stricter=0,
                 generator_misses=0)
    with tempfile.TemporaryDirectory() as tmp:
        for want, schema in REFUSED.items():
            g, err = to_gbnf(schema, tmp)
            check(g is None and err and want in err, "refusal '%s' not named: %s" % (want, err or "accepted"))
            stats["refused"] += 1
        eng = engines(tmp)
        if not eng:
            print("no GBNF engine here (kvbatch's grammar.h not built, $KVB_GBNF_VALIDATOR unset): compile only")
        accepted = []
        for name, schema in corpus:
            g, err = to_gbnf(schema, tmp)
            if not check(g is not None, "%s refused: %s" % (name, err)):
                continue
            stats["accepted"] += 1
            accepted.append((name, schema, g))
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
            gen = Gen(schema, rng)
            must, must_not, may = [], [], []
            docs = []
            for _ in range(60):
                try:
                    d = gen.value(schema)
                except (RecursionError, ValueError) as e:
                    print("generator:", name, e)
                    continue
                if validator.is_valid(d):
                    docs.append(d)
                else:
                    stats["generator_misses"] += 1
                if len(docs) >= 10:
                    break
            check(len(docs) >= 3, "%s: the generator made only %d valid documents" % (name, len(docs)))
            for d in docs:
                for w in writings(d, rng):
                    must.append(w)
                for w in text_mutations(json.dumps(d, ensure_ascii=False), rng, 6):
                    try:
                        ok = validator.is_valid(json.loads(w))
                    except ValueError:
                        ok = False
                    (may if ok else must_not).append(w)
                for m in semantic_mutations(d, schema, gen, rng):
                    w = json.dumps(m, ensure_ascii=False)
                    (may if validator.is_valid(m) else must_not).append(w)
            stats["valid"] += len(must)
            stats["invalid"] += len(must_not)
            texts = must + must_not + may
            for ename, cmd in eng:
                res, why = run_engine(cmd, g, texts, tmp)
                if not check(res is not None, "%s: %s cannot run the grammar: %s" % (name, ename, why)):
                    continue
                for t, r in zip(must, res):
                    check(r == "full", "%s [%s]: valid document %s: %s" % (name, ename, json.dumps(t)[:300], r))
                for t, r in zip(must_not, res[len(must):]):
                    check(r != "full", "%s [%s]: invalid document accepted: %s" % (name, ename, json.dumps(t)[:300]))
                held = [t for t, r in zip(may, res[len(must) + len(must_not):]) if r != "full"]
                stats["stricter"] += len(held)
                if os.environ.get("KVB_SHOW_STRICTER"):
                    for t in held[:3]:
                        print("stricter", name, json.dumps(t))
        if any(e == "kvbatch" for e, _ in eng) and os.environ.get("KVB_SCHEMA_SAMPLE", "1") != "0" and \
                kvbcheck.ready():
            sampled(accepted, tmp)
    print("corpus: %(schemas)d schemas, %(accepted)d accepted, %(refused)d refused by name; "
          "%(valid)d valid and %(invalid)d invalid documents per engine; %(stricter)d JSON-Schema-valid "
          "variants held back (stricter by design); %(generator_misses)d generated documents jsonschema "
          "refused (dropped)" % stats)
    print("engines:", ", ".join(e for e, _ in eng) or "none")
    return kvbcheck.finish("schema corpus")


if __name__ == "__main__":
    sys.exit(main())
