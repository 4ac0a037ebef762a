#!/usr/bin/env python3
"""Cross-checks tests/data/chat_templates/*.golden.json against Python's jinja2 itself, set up the
way transformers' apply_chat_template sets it up (transformers/utils/chat_template_utils.py:
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its tojson,
raise_exception and strftime_now). The goldens come from @huggingface/jinja (make_goldens.mjs);
this confirms they are also what transformers renders.

    apt-get install python3-jinja2 && python3 tools/chat_template_goldens/check_with_jinja2.py
"""
import datetime
import json
import pathlib
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "chat_templates"
# The date make_goldens.mjs and tests/jinja/jinja_test.cpp pin strftime_now to.
FIXED_NOW = datetime.datetime(2025, 3, 14, 9, 26, 53)


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = make_environment()
    failures = 0
    total = 0
    for golden_path in sorted(DATA.glob("*.golden.json")):
        family = golden_path.name[: -len(".golden.json")]
        template = env.from_string((DATA / f"{family}.jinja").read_text(encoding="utf-8"))
        for case in json.loads(golden_path.read_text(encoding="utf-8")):
            total += 1
            try:
                result = {"output": template.render(**case["context"])}
            except jinja2.exceptions.TemplateError as e:
                result = {"error": str(e)}
            expected = {k: case[k] for k in ("output", "error") if k in case}
            if result != expected:
                failures += 1
                print(f"MISMATCH {family}/{case['name']}:\n  jinja2: {result!r}\n  golden: {expected!r}")
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
