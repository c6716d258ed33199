"""The program the harness plug-ins run in the box (`python3 -I -c SCRIPT REQUEST`) through the
public API's `shell` tool: it runs an argv with stdin, env, cwd and a timeout, reads and writes
files anywhere the box user may, and answers with one JSON line. Payloads larger than one tool call
travel as base64 files in the workspace's `.oa-plugin/` directory, read and written with the API's
`read_bytes`/`write_bytes` (raw: "raw" names; the older base64 lines still read).
It runs as the box's own user: it can do nothing a `shell` call cannot."""

from __future__ import annotations

SCRIPT = r"""
import base64, json, os, pwd, signal, subprocess, sys, time
stage = os.path.join(os.getcwd(), ".oa-plugin")
if sys.argv[1].startswith("@"):
    with open(os.path.join(stage, sys.argv[1][1:]), "rb") as f:
        req = json.loads(base64.b64decode(f.read()))
    os.unlink(os.path.join(stage, sys.argv[1][1:]))
else:
    req = json.loads(base64.b64decode(sys.argv[1]))
def answer(**kw):
    sys.stdout.write("\nOA-PLUGIN-RESULT " + json.dumps(kw) + "\n"); sys.stdout.flush(); sys.exit(0)
def fail(kind, err, path):
    answer(error=kind, message="%s: %s" % (path, getattr(err, "strerror", None) or err))
def payload(spec, sink):
    if "inline" in spec:
        sink.write(base64.b64decode(spec["inline"]))
    for name in spec.get("staged", []):
        with open(os.path.join(stage, name), "rb") as f:
            sink.write(base64.b64decode(f.read()))
        os.unlink(os.path.join(stage, name))
    for name in spec.get("raw", []):
        with open(os.path.join(stage, name), "rb") as f:
            while True:
                piece = f.read(1 << 20)
                if not piece:
                    break
                sink.write(piece)
        os.unlink(os.path.join(stage, name))
def send(path, size, budget, rid, tag):
    if size > budget and req.get("raw"):
        name = "%s-%s.bin" % (tag, rid)
        with open(path, "rb") as f, open(os.path.join(stage, name), "wb") as out:
            while True:
                piece = f.read(1 << 20)
                if not piece:
                    break
                out.write(piece)
        return {"raw": name, "size": size}
    with open(path, "rb") as f:
        data = f.read()
    if size <= budget:
        return {"inline": base64.b64encode(data).decode(), "size": size}
    name = "%s-%s.b64" % (tag, rid)
    text = base64.b64encode(data).decode()
    lines = [text[i:i + 48000] for i in range(0, len(text), 48000)]
    with open(os.path.join(stage, name), "w") as f:
        f.write("\n".join(lines) + "\n")
    return {"staged": name, "lines": len(lines), "size": size}
os.makedirs(stage, exist_ok=True)
op, rid = req["op"], req["id"]
if op == "write":
    path = req["path"]
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(21, "Is a directory")
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as sink:
            payload(req["data"], sink)
        if isinstance(req.get("mode"), int):
            os.chmod(path, req["mode"] & 0o777)
    except IsADirectoryError as err:
        fail("is_dir", err, path)
    except PermissionError as err:
        fail("permission", err, path)
    except FileNotFoundError as err:
        fail("not_found", err, path)
    except OSError as err:
        fail("os", err, path)
    answer(ok=True)
if op == "read":
    path = req["path"]
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(21, "Is a directory")
        with open(path, "rb"):
            pass
        size = os.path.getsize(path)
    except IsADirectoryError as err:
        fail("is_dir", err, path)
    except PermissionError as err:
        fail("permission", err, path)
    except FileNotFoundError as err:
        fail("not_found", err, path)
    except OSError as err:
        fail("os", err, path)
    if size > req["limit"]:
        answer(error="limit", message="%s: %d bytes" % (path, size), size=size)
    answer(ok=True, data=send(path, size, req["inline"], rid, "rd"))
# exec
user = req.get("user")
me = pwd.getpwuid(os.getuid()).pw_name
if user not in (None, "", me, str(os.getuid())):
    answer(error="user", message="the box runs every command as %s, never as %s" % (me, user))
env = dict(os.environ)
env.update(req.get("env") or {})
out_path, err_path, in_path = (os.path.join(stage, "%s-%s" % (t, rid)) for t in ("out", "err", "in"))
stdin = subprocess.DEVNULL
if req.get("stdin") is not None:
    with open(in_path, "wb") as sink:
        payload(req["stdin"], sink)
    stdin = open(in_path, "rb")
cwd = req.get("cwd") or None
timed_out = False
try:
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(req["cmd"], stdin=stdin, stdout=out,
                                stderr=subprocess.STDOUT if req.get("merge") else err,
                                cwd=cwd, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=req["timeout"])
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
except PermissionError as e:
    fail("permission", e, req["cmd"][0])
except FileNotFoundError as e:
    if cwd and not os.path.isdir(cwd):
        fail("not_found", e, cwd)
    with open(err_path, "wb") as err:
        err.write(("%s: command not found\n" % req["cmd"][0]).encode())
    rc = 127
except OSError as e:
    fail("os", e, req["cmd"][0])
finally:
    if stdin is not subprocess.DEVNULL:
        stdin.close()
        os.unlink(in_path)
sizes = [os.path.getsize(out_path), os.path.getsize(err_path)]
limit = req["limit"]
if max(sizes) > limit:
    for p in (out_path, err_path):
        os.unlink(p)
    answer(error="limit", message="output of %d bytes" % max(sizes), size=max(sizes))
budget = req["inline"]
out = send(out_path, sizes[0], budget, rid, "out")
err = send(err_path, sizes[1], budget - (sizes[0] if "inline" in out else 0), rid, "err")
os.unlink(out_path); os.unlink(err_path)
answer(ok=True, rc=(128 - rc) if rc < 0 else rc, timed_out=timed_out, stdout=out, stderr=err)
"""
