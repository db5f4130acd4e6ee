# The outcome of every test case in a JUnit XML file written by CPython's regression test
# runner (`python -m test --junit-xml FILE`, 3.8+), one per line: "<test id>\t<outcome>",
# the outcome one of ok, skipped, failure, error. Used by tests/cpython_regrtest.rs.
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
for case in root.iter("testcase"):
    tags = {child.tag for child in case}
    outcome = "ok"
    for tag in ("error", "failure", "skipped"):
        if tag in tags:
            outcome = tag
            break
    print("%s\t%s" % (case.get("name"), outcome))
