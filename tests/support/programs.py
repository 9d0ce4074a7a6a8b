"""Programs the tests run in workloads (passed as ``python -c`` commands)."""

#: a gloo all-reduce over a distributed job's workers; WAIT_FIRST: the first run sleeps
ALL_REDUCE = r"""
import os, socket, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=90))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
first = not os.path.exists("/tmp/ran")
print(f"rank {rank} of {world} on {socket.gethostname()} gpus "
      f"{os.environ.get('NVIDIA_VISIBLE_DEVICES')} sum {t.item():g}", flush=True)
dist.destroy_process_group()
if first and os.environ.get("WAIT_FIRST"):
    open("/tmp/ran", "w").close()
    time.sleep(600)
"""

#: a web app for a job's ports: echo and flood websockets, an endless stream, a request mirror
APP = r"""
import json, tornado.web, tornado.websocket, tornado.ioloop
class Echo(tornado.websocket.WebSocketHandler):
    def check_origin(self, origin): return True
    def on_message(self, m): self.write_message("echo:" + m)
class Seen(tornado.web.RequestHandler):
    def check_xsrf_cookie(self): pass
    def seen(self):
        self.set_header("Set-Cookie", "planted=1; Path=/")
        self.write(json.dumps({"uri": self.request.uri, "headers": dict(self.request.headers),
                               "body": self.request.body.decode()}))
    get = post = seen
class Flood(tornado.websocket.WebSocketHandler):  # 4 MiB messages, as fast as they go
    def check_origin(self, origin): return True
    async def open(self):
        tornado.ioloop.IOLoop.current().spawn_callback(self.flood)
    async def flood(self):
        while True:
            await self.write_message(b"x" * (4 << 20), binary=True)
class Stream(tornado.web.RequestHandler):  # an endless answer, 1 MiB at a time
    async def get(self):
        while True:
            self.write(b"y" * (1 << 20))
            await self.flush()
tornado.web.Application(
    [(r".*/ws", Echo), (r".*/flood", Flood), (r".*/stream", Stream), (r".*", Seen)]
).listen(8765)
print("listening", flush=True)
tornado.ioloop.IOLoop.current().start()
"""

#: an attacker's app (tornado is in the python image): it records every request and websocket
#: handshake it gets, headers and query included, in its output (which its owner reads); its
#: page sets a cookie for the whole origin and opens a websocket back to the app
RECORDER = r"""
import json, tornado.web, tornado.websocket, tornado.ioloop
def record(kind, request):
    print("SEEN " + json.dumps({"kind": kind, "uri": request.uri,
                                "headers": dict(request.headers)}), flush=True)
class Ws(tornado.websocket.WebSocketHandler):
    def check_origin(self, origin): return True
    def open(self):
        record("ws", self.request)
        self.write_message("ws:ok")
PAGE = '''<html><body><p id=status>loaded</p><script>
const ws = new WebSocket(location.href.replace(/^http/, "ws").replace(/[^/]*$/, "") + "ws");
ws.onmessage = (e) => { document.getElementById("status").textContent = e.data; };
</script></body></html>'''
class Page(tornado.web.RequestHandler):
    def get(self):
        record("http", self.request)
        self.set_header("Set-Cookie", "appsession=owner-app-cookie; Path=/; HttpOnly")
        self.write(PAGE)
tornado.web.Application([(r".*/ws", Ws), (r".*", Page)]).listen(8080)
tornado.ioloop.IOLoop.current().start()
"""

#: a job's web app that answers, on any path, the headers it received: as JSON for ?json=1,
#: else a page that shows them (#http) and, from a websocket to ./ws, the websocket's (#ws)
HEADERS_ECHO = r"""
import json, tornado.escape, tornado.web, tornado.websocket, tornado.ioloop
class Ws(tornado.websocket.WebSocketHandler):
    def check_origin(self, origin): return True
    def open(self): self.write_message(json.dumps(dict(self.request.headers)))
PAGE = '''<html><body><pre id=http>%s</pre><pre id=ws>waiting</pre><script>
const ws = new WebSocket(location.href.replace(/^http/, "ws").replace(/[^/]*$/, "") + "ws");
ws.onmessage = (e) => { document.getElementById("ws").textContent = e.data; };
</script></body></html>'''
class Page(tornado.web.RequestHandler):
    def get(self):
        seen = json.dumps(dict(self.request.headers))
        if self.get_argument("json", None):
            self.set_header("Content-Type", "application/json")
            self.write(seen)
        else:
            self.write(PAGE % tornado.escape.xhtml_escape(seen))
tornado.web.Application([(r".*/ws", Ws), (r".*", Page)]).listen(8080)
tornado.ioloop.IOLoop.current().start()
"""
