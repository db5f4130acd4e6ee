"""A loopback OTLP profiles receiver for tests/push_otlp.rs, on PyPI's generated code.

Decodes each Export request with opentelemetry-proto's own messages (the package
tools/setup.sh installs: 1.45.2, generated from opentelemetry-proto v1.10.0), over gRPC
(grpcio, ProfilesService/Export) or HTTP (POST /v1development/profiles), and checks what
the proto cannot:
  - every location has a line (and those whose line has no number are listed);
  - index 0 of every dictionary table is its zero value (string_table[0] == "");
  - every index into a table is in bounds;
  - the resource has a non-empty service.name.
Each request is written as JSON (one file per request, in arrival order) to the folder
given: its transport metadata, its resource attributes, each profile's sample type and
samples with their stacks resolved to (function, file, line), and the problems found.

  python otlp_receiver.py grpc|http OUT_DIR [--refuse] [--answers A,B,...] [--port N]

Prints "port N" once listening (on port N when given, else any free one). Every request is
decoded and recorded first, then answered:
  --refuse: every request as a backend that does not take it (gRPC INVALID_ARGUMENT,
            HTTP 400);
  --answers: the first requests in turn, then ok: "ok", "refuse", "unavailable" (gRPC
            UNAVAILABLE, HTTP 503: try again), "partial" (OK, with a partial_success
            that rejects one profile, as the OTLP specification lets a server say).
Each request's answer is recorded with it ("answer").
"""

import gzip
import http.server
import json
import os
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2 as service_pb2,
    profiles_service_pb2_grpc as service_grpc,
)

LOCK = threading.Lock()
COUNT = [0]
ANSWERS = []


def next_answer(refuse):
    """The answer to the next request (in arrival order)."""
    if refuse:
        return "refuse"
    with LOCK:
        return ANSWERS.pop(0) if ANSWERS else "ok"


def response(answer):
    r = service_pb2.ExportProfilesServiceResponse()
    if answer == "partial":
        r.partial_success.rejected_profiles = 1
        r.partial_success.error_message = "one profile rejected by the test"
    return r


def any_value(v):
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def check_and_describe(req):
    """The request as JSON-ready data, with the problems the proto cannot catch."""
    problems = []
    ns = len(req.dictionary.string_table)
    # Functions of locations whose line has no number (the test says which may).
    unnumbered = []
    d = req.dictionary
    tables = {
        "mapping_table": d.mapping_table,
        "location_table": d.location_table,
        "function_table": d.function_table,
        "link_table": d.link_table,
        "attribute_table": d.attribute_table,
        "stack_table": d.stack_table,
    }
    if len(d.string_table) == 0 or d.string_table[0] != "":
        problems.append("string_table[0] is not the empty string")
    for name, table in tables.items():
        if len(table) == 0:
            problems.append("%s is empty (no zero value at 0)" % name)
        elif table[0].ListFields():
            problems.append("%s[0] is not the zero value: %s" % (name, table[0]))

    def index(what, i, table_name, n):
        if not 0 <= i < n:
            problems.append("%s: index %d out of %s's %d" % (what, i, table_name, n))
            return False
        return True

    string = lambda what, i: index(what, i, "string_table", ns) and d.string_table[i]
    for i, f in enumerate(d.function_table):
        string("function %d name" % i, f.name_strindex)
        string("function %d system name" % i, f.system_name_strindex)
        string("function %d file" % i, f.filename_strindex)
    for i, m in enumerate(d.mapping_table):
        string("mapping %d file" % i, m.filename_strindex)
        for a in m.attribute_indices:
            index("mapping %d" % i, a, "attribute_table", len(d.attribute_table))
    for i, a in enumerate(d.attribute_table):
        string("attribute %d key" % i, a.key_strindex)
        string("attribute %d unit" % i, a.unit_strindex)
    for i, loc in enumerate(d.location_table):
        index("location %d" % i, loc.mapping_index, "mapping_table", len(d.mapping_table))
        for a in loc.attribute_indices:
            index("location %d" % i, a, "attribute_table", len(d.attribute_table))
        for ln in loc.lines:
            index("location %d line" % i, ln.function_index, "function_table", len(d.function_table))
        if i > 0 and not loc.lines:
            problems.append("location %d has no line" % i)
        if i > 0 and any(ln.line <= 0 for ln in loc.lines):
            fi = loc.lines[0].function_index
            f = d.function_table[fi] if 0 <= fi < len(d.function_table) else None
            ok = f is not None and 0 <= f.name_strindex < ns and 0 <= f.filename_strindex < ns
            # file:function, so that the test can tell the fixture's frames from others.
            unnumbered.append(
                "%s:%s" % (d.string_table[f.filename_strindex], d.string_table[f.name_strindex])
                if ok else "?")
    for i, st in enumerate(d.stack_table):
        for li in st.location_indices:
            index("stack %d" % i, li, "location_table", len(d.location_table))

    def attrs(indices, what):
        out = {}
        for a in indices:
            if index(what, a, "attribute_table", len(d.attribute_table)):
                kv = d.attribute_table[a]
                out[d.string_table[kv.key_strindex]] = any_value(kv.value)
        return out

    def frame(li):
        loc = d.location_table[li]
        if not loc.lines:
            return {"function": "", "file": "", "line": 0}
        ln = loc.lines[0]
        f = d.function_table[ln.function_index]
        return {
            "function": d.string_table[f.name_strindex],
            "file": d.string_table[f.filename_strindex],
            "line": ln.line,
        }

    resources = []
    for rp in req.resource_profiles:
        resource = {kv.key: any_value(kv.value) for kv in rp.resource.attributes}
        if not resource.get("service.name"):
            problems.append("no service.name")
        profiles = []
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                t = p.sample_type
                string("sample type", t.type_strindex)
                string("sample unit", t.unit_strindex)
                samples = []
                for s in p.samples:
                    if not index("sample", s.stack_index, "stack_table", len(d.stack_table)):
                        continue
                    index("sample link", s.link_index, "link_table", len(d.link_table))
                    if len(s.values) != 1:
                        problems.append("a sample with %d values" % len(s.values))
                    stack = d.stack_table[s.stack_index].location_indices
                    ok = all(0 <= li < len(d.location_table) for li in stack)
                    samples.append({
                        "stack": [frame(li) for li in stack] if ok else [],
                        "value": sum(s.values),
                        "attributes": attrs(s.attribute_indices, "sample"),
                    })
                profiles.append({
                    "scope": sp.scope.name,
                    "type": d.string_table[t.type_strindex] if 0 <= t.type_strindex < ns else "",
                    "unit": d.string_table[t.unit_strindex] if 0 <= t.unit_strindex < ns else "",
                    "time_unix_nano": p.time_unix_nano,
                    "duration_nano": p.duration_nano,
                    "period": p.period,
                    "attributes": attrs(p.attribute_indices, "profile"),
                    "samples": samples,
                })
        resources.append({"attributes": resource, "profiles": profiles})
    return {"resources": resources, "problems": problems, "unnumbered": unnumbered}


def record(out_dir, transport, metadata, req, answer):
    doc = check_and_describe(req)
    doc["transport"] = transport
    doc["metadata"] = metadata
    doc["answer"] = answer
    with LOCK:
        n = COUNT[0]
        COUNT[0] += 1
    path = os.path.join(out_dir, "request-%04d.json" % n)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.rename(path + ".tmp", path)


class Service(service_grpc.ProfilesServiceServicer):
    def __init__(self, out_dir, refuse):
        self.out_dir = out_dir
        self.refuse = refuse

    def Export(self, request, context):
        md = {k: v for k, v in context.invocation_metadata()}
        answer = next_answer(self.refuse)
        record(self.out_dir, "grpc", md, request, answer)
        if answer == "refuse":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused by the test")
        if answer == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "unavailable for the test")
        return response(answer)


def serve_grpc(out_dir, refuse, port):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_grpc.add_ProfilesServiceServicer_to_server(Service(out_dir, refuse), server)
    port = server.add_insecure_port("127.0.0.1:%d" % port)
    server.start()
    print("port %d" % port, flush=True)
    server.wait_for_termination()


def serve_http(out_dir, refuse, port):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            md = {k.lower(): v for k, v in self.headers.items()}
            md[":path"] = self.path
            req = service_pb2.ExportProfilesServiceRequest()
            req.ParseFromString(body)
            answer = next_answer(refuse)
            record(out_dir, "http", md, req, answer)
            status = {"refuse": 400, "unavailable": 503}.get(answer, 200)
            reply = response(answer).SerializeToString() if status == 200 else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("port %d" % server.server_address[1], flush=True)
    server.serve_forever()


def main():
    transport, out_dir = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    refuse = "--refuse" in rest
    option = lambda name: rest[rest.index(name) + 1] if name in rest else None
    ANSWERS.extend(a for a in (option("--answers") or "").split(",") if a)
    unknown = set(ANSWERS) - {"ok", "refuse", "unavailable", "partial"}
    if unknown:
        sys.exit("unknown answers: %s" % ", ".join(sorted(unknown)))
    port = int(option("--port") or 0)
    os.makedirs(out_dir, exist_ok=True)
    if transport == "grpc":
        serve_grpc(out_dir, refuse, port)
    elif transport == "http":
        serve_http(out_dir, refuse, port)
    else:
        sys.exit("expected grpc or http")


main()
