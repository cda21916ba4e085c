"""JUnit XML: one test case per check, so CI systems show each budget as a test.

Failing checks carry ``<failure message=... type=...>`` with the numbers;
checks that cannot run are ``<skipped>``; a warning passes and says why in
``<system-out>``. Rendered from the JSON document; times are 0 (the bytes of
a report do not depend on how long it took).

Every string from the document is :func:`tracetool.untrusted.shown` first: XML 1.0 cannot hold
most control characters at all (a parser refuses the file), and CI pages show these strings.
ElementTree escapes ``<``, ``&`` and quotes.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from tracetool.untrusted import shown


def render_junit(doc: dict[str, Any]) -> str:
    """The report as a JUnit XML document (UTF-8 text, ends with a newline)."""
    s, t, b = doc["summary"], doc["trace"], doc["baseline"]
    counts = {"tests": str(s["checks"]), "failures": str(s["failed"]), "errors": "0",
              "skipped": str(s["skipped"]), "time": "0"}
    root = ET.Element("testsuites", {"name": "tracetool report", **counts})
    name = f"tracetool report: {shown(t['label'])}" + (f" vs {shown(b['label'])}" if b else "")
    suite = ET.SubElement(root, "testsuite", {"name": name, **counts})
    props = ET.SubElement(suite, "properties")
    for key, value in (("format", f"{doc['format']}/{doc['version']}"), ("trace", t["label"]),
                       ("baseline", b["label"] if b else ""), ("budget", doc["settings"]["budget"] or ""),
                       ("headline", doc.get("headline") or "")):
        ET.SubElement(props, "property", {"name": key, "value": shown(value)})
    for c in doc["checks"]:
        case = ET.SubElement(suite, "testcase", {"classname": shown(f"tracetool.report.{c['kind']}"),
                                                 "name": shown(f"{c['key']}: {c['title']}"), "time": "0"})
        message = shown(c["message"])
        if c["status"] == "fail":
            failure = ET.SubElement(case, "failure", {"message": message, "type": shown(c["kind"])})
            failure.text = _details(c, message)
        elif c["status"] == "skip":
            ET.SubElement(case, "skipped", {"message": message})
        elif c["status"] == "warn":
            ET.SubElement(case, "system-out").text = "warning: " + message
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _details(c: dict[str, Any], message: str) -> str:
    parts = [f"value={c['value']} {c['unit']}", f"limit={c['limit']:g} {c['unit']}"]
    if c["ci_low"] is not None:
        parts.append(f"ci=[{c['ci_low']}, {c['ci_high']}] pct")
    return message + "\n" + " ".join(parts)


__all__ = ["render_junit"]
