#!/usr/bin/env python3
"""tests/grammar/gen_schemas.py — writes the grammar engine's schema corpus (schemas/*.json).

Deterministic (seeded): gen_NNN.json are random compositions of the supported features
(nested objects, arrays, enums, anyOf/oneOf over distinct types, $ref recursion, patterns,
formats, numeric bounds, lengths); the hand-written real-world shapes (real_*.json) and the
deliberately unsupported ones (unsupported_*.json, whose expected error is listed in
expected_errors.txt) live beside them and are not touched. Run from anywhere:
    python3 tests/grammar/gen_schemas.py
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "schemas")
N = 200

WORDS = ["id", "name", "city", "count", "tags", "price", "items", "user", "email", "when",
         "kind", "score", "notes", "addr", "zip", "flag", "level", "owner", "data", "meta",
         "title", "année", "größe", "名前"]
PATTERNS = ["^[a-z]{2,8}$", "^[A-Z][a-z]+$", "^\\d{3}-\\d{4}$", "^(yes|no|maybe)$",
            "^[a-f0-9]{6}$", "^item_[0-9]+$", "^[^\"\\\\]{1,5}$", "^é+ü?$"]
FORMATS = ["date", "time", "date-time", "uuid", "email", "ipv4"]


def leaf(r):
    k = r.randrange(12)
    if k == 0:
        return {"type": "string"}
    if k == 1:
        lo = r.randrange(0, 4)
        return {"type": "string", "minLength": lo, "maxLength": lo + r.randrange(0, 12)}
    if k == 2:
        return {"type": "string", "pattern": r.choice(PATTERNS)}
    if k == 3:
        return {"type": "string", "format": r.choice(FORMATS)}
    if k == 4:
        s = {"type": "integer"}
        if r.random() < 0.7:
            s["minimum"] = r.randrange(-1000, 100)
        if r.random() < 0.7:
            s["maximum"] = s.get("minimum", -50) + r.randrange(0, 100000)
        if r.random() < 0.2:
            s["exclusiveMinimum"] = s.pop("minimum", 0)
        return s
    if k == 5:
        s = {"type": "number"}
        if r.random() < 0.6:
            s["minimum"] = r.choice([0, -1, 0.5, -10])
            s["maximum"] = s["minimum"] + r.choice([1, 10, 1000])
        return s
    if k == 6:
        return {"type": "boolean"}
    if k == 7:
        return {"enum": r.sample(["red", "green", "blue", "a\"b", "ünï", 1, 2.5, None, True], r.randrange(1, 5))}
    if k == 8:
        return {"const": r.choice(["fixed", 42, False, {"x": [1, 2]}])}
    if k == 9:
        return {"type": ["string", "null"], "maxLength": r.randrange(1, 10)}
    if k == 10:
        return {"type": "integer", "nullable": True, "minimum": 0, "maximum": 9}
    return {"type": "null"}


def node(r, depth):
    if depth <= 0 or r.random() < 0.35:
        return leaf(r)
    k = r.randrange(6)
    if k <= 2:
        n = r.randrange(1, 5)
        keys = r.sample(WORDS, n)
        props = {key: node(r, depth - 1) for key in keys}
        s = {"type": "object", "properties": props,
             "required": [key for key in keys if r.random() < 0.6]}
        if r.random() < 0.7:
            s["additionalProperties"] = False
        elif r.random() < 0.5:
            s["additionalProperties"] = {"type": "integer", "minimum": 0, "maximum": 9}
        return s
    if k == 3:
        s = {"type": "array", "items": node(r, depth - 1)}
        if r.random() < 0.6:
            s["minItems"] = r.randrange(0, 3)
        if r.random() < 0.6:
            s["maxItems"] = s.get("minItems", 0) + r.randrange(0, 4)
        if r.random() < 0.2:
            s["prefixItems"] = [leaf(r) for _ in range(r.randrange(1, 3))]
        return s
    if k == 4:
        types = r.sample(["string", "integer", "boolean", "null", "object", "array"], 2)
        branches = []
        for t in types:
            if t == "object":
                branches.append({"type": "object", "properties": {"k": leaf(r)}, "required": ["k"],
                                 "additionalProperties": False})
            elif t == "array":
                branches.append({"type": "array", "items": leaf(r), "maxItems": 3})
            else:
                branches.append({"type": t})
        return {r.choice(["anyOf", "oneOf"]): branches}
    return {"allOf": [{"type": "object", "properties": {"a": leaf(r)}, "required": ["a"]},
                      {"properties": {"b": leaf(r)}}], "additionalProperties": False}


def recursive(r):
    return {
        "$defs": {"node": {"type": "object", "properties": {
            "value": leaf(r),
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
            "required": ["value"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}


def main():
    os.makedirs(OUT, exist_ok=True)
    r = random.Random(20240616)
    for i in range(N):
        s = recursive(r) if i % 10 == 9 else node(r, r.randrange(1, 4))
        with open(os.path.join(OUT, "gen_%03d.json" % i), "w", encoding="utf-8") as f:
            json.dump(s, f, ensure_ascii=False, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
