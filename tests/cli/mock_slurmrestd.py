#!/usr/bin/env python3
"""A stand-in for slurmrestd (API v0.0.38) for tests/cli/hearth_secrets.sh: enough of the
REST API for hearth's slurmrest backend (openapi, job/submit, jobs, job/ID, DELETE job/ID),
running each job's script locally as Slurm would (its environment, working directory and
output files).  Every request must carry X-SLURM-USER-TOKEN equal to $MOCK_TOKEN (else 401,
as slurmrestd refuses a bad token), except that $MOCK_FORBIDDEN_TOKEN, when set, is a token
the stand-in knows but whose user may do nothing (403, as slurmrestd answers an
unauthorised user).  Each request is logged to LOG as one JSON line
(method, path, headers, body) so that a test can see what left hearth.

usage: mock_slurmrestd.py PORT_FILE LOG   (listens on 127.0.0.1, a free port written to
PORT_FILE)"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API = "/slurm/v0.0.38"
TOKEN = os.environ["MOCK_TOKEN"]
FORBIDDEN = os.environ.get("MOCK_FORBIDDEN_TOKEN")
LOCK = threading.Lock()
JOBS = {}            # id -> {"proc", "name", "comment", "cancelled"}
NEXT_ID = [100]
SCRIPTS = tempfile.mkdtemp(prefix="mock-slurmrestd.")


def job_entry(jid, j):
    rc = j["proc"].poll()
    if rc is None:
        state, code = "RUNNING", 0
    elif j["cancelled"]:
        state, code = "CANCELLED", 15
    else:
        state = "COMPLETED" if rc == 0 else "FAILED"
        code = (rc & 0xff) << 8 if rc >= 0 else -rc
    return {"job_id": jid, "name": j["name"], "comment": j["comment"],
            "job_state": state, "exit_code": code}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self, method):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        with LOCK, open(sys.argv[2], "a") as log:
            log.write(json.dumps({"method": method, "path": self.path,
                                  "headers": dict(self.headers), "body": body}) + "\n")
        if FORBIDDEN and self.headers.get("X-SLURM-USER-TOKEN") == FORBIDDEN:
            return self.reply(403, {"errors": [{"error": "Access denied"}]})
        if self.headers.get("X-SLURM-USER-TOKEN") != TOKEN:
            return self.reply(401, {"errors": [{"error": "Authentication failure"}]})
        if method == "GET" and self.path == "/openapi":
            return self.reply(200, {"paths": {API + "/job/submit": {}, API + "/jobs": {}}})
        if method == "POST" and self.path == API + "/job/submit":
            return self.submit(json.loads(body))
        if method == "GET" and self.path == API + "/jobs":
            with LOCK:
                return self.reply(200, {"jobs": [job_entry(k, j) for k, j in JOBS.items()],
                                        "errors": []})
        if self.path.startswith(API + "/job/"):
            jid = int(self.path.rsplit("/", 1)[1])
            with LOCK:
                j = JOBS.get(jid)
                if not j:
                    return self.reply(200, {"jobs": [], "errors": [{"error": "Invalid job id"}]})
                if method == "DELETE":
                    j["cancelled"] = True
                    try:
                        os.killpg(j["proc"].pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                    return self.reply(200, {"errors": []})
                return self.reply(200, {"jobs": [job_entry(jid, j)], "errors": []})
        return self.reply(404, {"errors": [{"error": "no such path " + self.path}]})

    def submit(self, sub):
        job = sub["job"]
        with LOCK:
            jid = NEXT_ID[0]
            NEXT_ID[0] += 1
        script = os.path.join(SCRIPTS, "job%d.sh" % jid)
        with open(script, "w") as f:
            f.write(sub["script"])
        out = open(job["standard_output"], "a")
        err = open(job["standard_error"], "a")
        env = dict(job["environment"])
        env["SLURM_JOB_ID"] = str(jid)
        proc = subprocess.Popen(["bash", script], cwd=job["current_working_directory"], env=env,
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        out.close()
        err.close()
        with LOCK:
            JOBS[jid] = {"proc": proc, "name": job["name"], "comment": job["comment"],
                         "cancelled": False}
        return self.reply(200, {"job_id": jid, "errors": []})

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_DELETE(self):
        self.handle_any("DELETE")


def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    try:
        srv.serve_forever()
    finally:
        for j in JOBS.values():
            if j["proc"].poll() is None:
                os.killpg(j["proc"].pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
