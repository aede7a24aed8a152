#!/usr/bin/env python3
"""Summarises a ctest JUnit file (ctest --output-junit): counts of passed, failed and skipped
tests, the skips grouped by reason (one line each, the most common first), the failed tests by
name. Used by scripts/test.sh; exit 0 always (ctest's own exit code is the verdict).

    scripts/test_summary.py build/Testing/junit.xml
"""
import collections
import re
import sys
import xml.etree.ElementTree as ET

# GoogleTest prints "file.cpp:12: Skipped" then the reason on the lines up to "[  SKIPPED ]".
_SKIP = re.compile(r":\d+: Skipped\n(.*?)\n*\[  SKIPPED \]", re.S)
# A test skipped by its exit code or output (SKIP_RETURN_CODE, SKIP_REGULAR_EXPRESSION) prints
# "SKIP: reason" (tests/support/srun_launch.sh).
_SKIP_LINE = re.compile(r"^SKIP: (.+)$", re.M)
# Reasons differing only in numbers (sizes, counts, device ids) are one reason.
_NUMBER = re.compile(r"\d+(\.\d+)?")


def skip_reason(case):
    out = case.findtext("system-out") or ""
    m = _SKIP.search(out)
    if m and m.group(1).strip():
        reason = " ".join(m.group(1).split())
        return _NUMBER.sub("N", reason)
    m = _SKIP_LINE.search(out)
    if m:
        return m.group(1).strip()
    skipped = case.find("skipped")
    message = skipped.get("message", "") if skipped is not None else ""
    if message and message != "SKIP_REGULAR_EXPRESSION_MATCHED":
        return message
    return "(no reason printed)"


def summarise(path):
    cases = ET.parse(path).getroot().iter("testcase")
    passed, failed, reasons = 0, [], collections.Counter()
    for case in cases:
        status = case.get("status", "")
        if case.find("failure") is not None or status == "fail":
            failed.append(case.get("name", "?"))
        elif case.find("skipped") is not None or status in ("notrun", "disabled"):
            reasons[skip_reason(case)] += 1
        else:
            passed += 1
    skipped = sum(reasons.values())
    lines = [f"summary: {passed} passed, {len(failed)} failed, {skipped} skipped"]
    if reasons:
        lines.append("skipped, by reason:")
        width = len(str(max(reasons.values())))
        for reason, n in reasons.most_common():
            lines.append(f"  {n:>{width}}  {reason[:150]}")
    if failed:
        lines.append("failed:")
        lines.extend(f"  {name}" for name in failed)
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        print("usage: test_summary.py JUNIT_XML", file=sys.stderr)
        return 2
    try:
        print(summarise(argv[1]))
    except (OSError, ET.ParseError) as e:
        print(f"test_summary: cannot read {argv[1]}: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
