"""The coordinator's dashboard in Debian's headless Chromium, driven over the DevTools protocol
(python3-websocket), against a real local cluster (a coordinator and 2 workers): every page loads
without console errors or uncaught exceptions, and its charts carry the gRPC API's figures.
Screenshots of every page go to $TEST_UNDECLARED_OUTPUTS_DIR."""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.request

import websocket

import zeroshard
from cluster_support import start_local_cluster, wait_until
from zeroshard._proto.zeroshard.v1 import job_pb2
from zeroshard._proto.zeroshard.v1 import types_pb2

WORKERS = 2
SEED_STEPS = 25
# The live job runs until the test cancels it; its checkpoints give the job page events. The
# `small` preset (1M parameters) in buckets of LIVE_BUCKET_ELEMS: a shard map of 4 buckets, and
# steps slow enough that the job does not flood the shared cores with events.
ENDLESS_STEPS = 10**9
CHECKPOINT_EVERY = 20
LIVE_BUCKET_ELEMS = 300000
# Generous: the machine's cores are shared with other builds.
JOB_TIMEOUT_S = 180
PAGE_TIMEOUT_S = 60
BROWSER_START_TIMEOUT_S = 60
VIEWPORT = (1200, 900)
README_CLIP = {"x": 0, "y": 0, "width": 1140, "height": 1900, "scale": 0.7}
ENDED = (job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED)
BYTES_PER_PARAM_DTYPE = {"FLOAT32": 4, "BFLOAT16": 2, "FLOAT16": 2, "FLOAT64": 8}


class DevTools:
    """A DevTools-protocol session on one page target. Not thread-safe: one caller at a time.

    Every event is collected while waiting for a command's answer; console errors, uncaught
    exceptions and error-level log entries are kept in `errors` until the caller clears them.
    """

    def __init__(self, websocket_url):
        self._socket = websocket.create_connection(websocket_url, timeout=PAGE_TIMEOUT_S,
                                                   suppress_origin=True)
        self._next_id = 0
        self.errors = []

    def close(self):
        self._socket.close()

    def _record(self, message):
        method = message.get("method")
        params = message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = [arg.get("value", arg.get("description", "")) for arg in params.get("args", [])]
            self.errors.append("console.%s: %s" % (params["type"], " ".join(map(str, texts))))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            exception = details.get("exception", {})
            self.errors.append("uncaught exception: %s" % exception.get("description", details.get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append("log (%s): %s %s" % (entry.get("source"), entry.get("text"), entry.get("url", "")))

    def call(self, method, **params):
        self._next_id += 1
        request_id = self._next_id
        self._socket.send(json.dumps({"id": request_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == request_id:
                if "error" in message:
                    raise AssertionError("%s: %s" % (method, message["error"]))
                return message.get("result", {})
            self._record(message)

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError("evaluating %r: %s" % (expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def drain(self):
        """Takes in the events sent so far (a round trip: every earlier event comes before it)."""
        self.call("Runtime.evaluate", expression="0")


class Browser:
    """Debian's chromium, headless, with HOME and its profile under `root`; one page target."""

    def __init__(self, root):
        self._root = root
        self.devtools = None
        profile = os.path.join(root, "profile")
        os.makedirs(profile, exist_ok=True)
        port_file = os.path.join(profile, "DevToolsActivePort")
        if os.path.exists(port_file):  # a previous browser's: its port is gone
            os.remove(port_file)
        env = dict(os.environ, HOME=root)
        self._log = open(os.path.join(root, "chromium.log"), "wb")
        self._process = subprocess.Popen(
            ["chromium", "--headless=new", "--no-sandbox", "--remote-debugging-port=0",
             "--user-data-dir=" + profile, "--no-first-run", "--disable-gpu",
             "--disable-dev-shm-usage", "--window-size=%d,%d" % VIEWPORT, "about:blank"],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._connect(port_file)
        except BaseException:
            self.close()
            raise

    def _connect(self, port_file):
        wait_until(lambda: self._process.poll() is not None or os.path.exists(port_file)
                   and open(port_file).read().count("\n") >= 1,
                   BROWSER_START_TIMEOUT_S, "chromium's DevToolsActivePort")
        if self._process.poll() is not None:
            raise AssertionError("chromium exited with %d: %s" % (self._process.returncode,
                                                                 self.log_tail()))
        port = int(open(port_file).read().split("\n")[0])
        with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port) as response:
            targets = json.load(response)
        page = next(t for t in targets if t.get("type") == "page")
        self.devtools = DevTools(page["webSocketDebuggerUrl"])
        self.devtools.call("Runtime.enable")
        self.devtools.call("Log.enable")
        self.devtools.call("Page.enable")
        self.devtools.call("Emulation.setDeviceMetricsOverride", width=VIEWPORT[0],
                           height=VIEWPORT[1], deviceScaleFactor=1, mobile=False)

    def log_tail(self):
        self._log.flush()
        with open(os.path.join(self._root, "chromium.log"), "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def close(self):
        if self.devtools is not None:
            try:
                self.devtools.close()
            except Exception:  # the browser may be gone already; it is killed below either way
                pass
        if self._process.poll() is None:
            os.killpg(self._process.pid, 15)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, 9)
                self._process.wait()
        self._log.close()

    def open(self, url, page):
        """Loads `url` (from a blank page, so nothing of the previous page stays) and waits until
        the page root `data-page=page` says data-ready."""
        self.devtools.call("Page.navigate", url="about:blank")
        self.devtools.call("Page.navigate", url=url)
        selector = '[data-page="%s"][data-ready="true"]' % page
        try:
            wait_until(lambda: self.devtools.evaluate("!!document.querySelector(%s)" % json.dumps(selector)),
                       PAGE_TIMEOUT_S, url + " to be ready")
        except AssertionError as e:
            shown = self.devtools.evaluate("document.body ? document.body.innerText.slice(0, 300) : ''")
            raise AssertionError("%s; errors: %s; the page shows: %r" % (e, self.devtools.errors, shown)) from None

    def screenshot(self, path, clip=None):
        """Saves the viewport, or `clip` ({x, y, width, height, scale}, beyond the viewport too)."""
        params = {"format": "png"}
        if clip:
            params.update(clip=clip, captureBeyondViewport=True)
        data = self.devtools.call("Page.captureScreenshot", **params)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def attributes(self, selector, *names):
        """Each element matching `selector` as a dict of the attributes `names`."""
        return self.devtools.evaluate(
            "[...document.querySelectorAll(%s)].map(e => Object.fromEntries(%s.map(n => [n, e.getAttribute(n)])))"
            % (json.dumps(selector), json.dumps(list(names))))


def progress_steps(client, job_id):
    """The steps the job's PROGRESS events report (WatchJob's history; the job has ended)."""
    return {event.progress.step for event in client.watch(job_id, timeout=JOB_TIMEOUT_S)
            if event.type == job_pb2.PROGRESS}


def memory_categories():
    """MemoryBreakdown's categories as (field name, JSON name): every field but the total."""
    return [(field.name, field.json_name) for field in types_pb2.MemoryBreakdown.DESCRIPTOR.fields
            if field.name != "total_bytes"]


class DashboardTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.temp = tempfile.mkdtemp(prefix="zs-dash-", dir=os.environ.get("TEST_TMPDIR"))
        cls.outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or cls.temp
        cls.cluster, cls.log_dir = start_local_cluster(WORKERS, "zs-dash-")
        try:
            cls.client = zeroshard.Client(cls.cluster.address)
            cls.base_url = "http://127.0.0.1:%d/" % cls.cluster.metrics_port
            cls.finished = {}
            # ZERO3 exercises the gather pool's memory category and the formula's third mode.
            for mode in ("ZERO2", "DDP", "ZERO3"):
                job = cls.client.submit(spec("dash-" + mode.lower(), mode, SEED_STEPS))
                wait_until(lambda: cls.client.get(job.id).state in ENDED, JOB_TIMEOUT_S, job.id + " to end")
                cls.finished[mode] = cls.client.get(job.id)
            cls.live = cls.client.submit(spec("dash-live", "ZERO2", ENDLESS_STEPS,
                                              workload={"preset": "small"},
                                              bucketElems=LIVE_BUCKET_ELEMS,
                                              checkpoint={"everySteps": CHECKPOINT_EVERY}))
            wait_until(lambda: cls.client.get(cls.live.id).latest_checkpoint.step > 0, JOB_TIMEOUT_S,
                       cls.live.id + "'s first checkpoint")
            cls.browser = Browser(cls.temp)
        except BaseException:
            cls.cluster.stop_all()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.browser.close()
        cls.client.close()
        cls.cluster.stop_all()
        shutil.rmtree(cls.log_dir, ignore_errors=True)

    def load(self, route, page, screenshot):
        """Opens `route`, checks it raised no error, and saves its screenshot."""
        self.browser.devtools.errors.clear()
        self.browser.open(self.base_url + route, page)
        self.browser.screenshot(os.path.join(self.outputs, screenshot))
        self.browser.devtools.drain()
        self.assertEqual(self.browser.devtools.errors, [], "errors on " + route)

    def test_0_harness_catches_errors(self):
        # The negative self-check: a thrown exception and a console.error must both be seen.
        self.browser.open(self.base_url + "#/cluster", "cluster")
        self.browser.devtools.errors.clear()
        self.browser.devtools.evaluate(
            "setTimeout(() => { throw new Error('self-check throw'); }, 0); console.error('self-check console'); 0")
        wait_until(lambda: (self.browser.devtools.drain() or True) and len(self.browser.devtools.errors) >= 2,
                   PAGE_TIMEOUT_S, "the harness to see both errors")
        joined = "\n".join(self.browser.devtools.errors)
        self.assertIn("self-check throw", joined)
        self.assertIn("self-check console", joined)
        self.browser.devtools.errors.clear()

    def test_cluster_lists_every_worker(self):
        self.load("#/cluster", "cluster", "cluster.png")
        shown = {e["data-worker"] for e in self.browser.attributes("[data-worker]", "data-worker")}
        workers = {worker.id for worker in self.client.workers()}
        self.assertEqual(len(workers), WORKERS)
        self.assertEqual(shown, workers)

    def test_jobs_lists_every_job(self):
        self.load("#/jobs", "jobs", "jobs.png")
        shown = {e["data-job"] for e in self.browser.attributes("[data-job]", "data-job")}
        self.assertEqual(shown, {job.id for job in self.client.list()})

    def check_memory(self, job, elements, job_attr=None):
        """The memory bars' (rank, category) -> bytes equal GetJob's rank_progress figures."""
        shown = {}
        for e in elements:
            if job_attr is None or e["data-job"] == job_attr:
                shown[(int(e["data-rank"]), e["data-category"])] = int(float(e["data-bytes"]))
        expected = {}
        self.assertEqual(len(job.rank_progress), WORKERS, job.id)
        for rank, metrics in enumerate(job.rank_progress):
            self.assertTrue(metrics.HasField("memory"), "%s rank %d reported no memory" % (job.id, rank))
            for name, json_name in memory_categories():
                expected[(rank, json_name)] = getattr(metrics.memory, name)
            shown_total = sum(v for (r, _), v in shown.items() if r == rank)
            self.assertEqual(shown_total, metrics.memory.total_bytes, "%s rank %d" % (job.id, rank))
        self.assertEqual(shown, expected, job.id)
        self.assertGreater(sum(expected.values()), 0)

    def test_finished_job_pages(self):
        for mode, job in self.finished.items():
            with self.subTest(mode=mode):
                job = self.client.get(job.id)
                self.assertEqual(job.state, job_pb2.SUCCEEDED, job.message)
                self.load("#/jobs/" + job.id, "job", "job-%s.png" % mode.lower())
                if mode == "ZERO2":
                    # The README's picture (docs/images/dashboard-job.png): loss, step time and
                    # memory, scaled down to stay small.
                    self.browser.screenshot(os.path.join(self.outputs, "dashboard-job.png"),
                                            clip=README_CLIP)
                points = self.browser.attributes('[data-chart="loss"] [data-point]', "data-point")
                steps = progress_steps(self.client, job.id)
                self.assertEqual(len(steps), SEED_STEPS)
                self.assertEqual(len(points), len(steps))
                self.assertEqual({int(p["data-point"]) for p in points}, steps)
                self.check_memory(job, self.browser.attributes(
                    '[data-chart="memory"] [data-category]', "data-rank", "data-category", "data-bytes"))
                # An ended job's shard map is its last generation's plan.
                plan = self.client.plan(job.id, include_layout=True)
                ranks = self.browser.attributes(
                    '[data-chart="shard-map"] [data-rank]', "data-rank", "data-bytes")
                self.assertEqual(sorted(int(r["data-rank"]) for r in ranks), list(range(plan.world_size)))
                element_bytes = BYTES_PER_PARAM_DTYPE[
                    types_pb2.DType.Name(job.spec.precision.param_dtype)]
                self.assertEqual(sum(int(float(r["data-bytes"])) for r in ranks),
                                 plan.total_elems * element_bytes)
                # The ZeRO formula marker shows the bytes the coordinator serves with the plan.
                markers = self.browser.attributes("[data-formula-bytes]", "data-formula-bytes")
                self.assertTrue(markers)
                self.assertEqual({int(float(m["data-formula-bytes"])) for m in markers},
                                 {formula_total(plan)})
                self.check_gather_pool(mode, job, plan)

    def check_gather_pool(self, mode, job, plan):
        """zero3's gather pool: a bar on every rank, counted within the plan's pool, and the
        formula marker names the pool; the other modes have none. Fails before the dashboard knew
        zero3 (no gatherPoolBytes category, a formula without the pool)."""
        pool_bytes = plan.model_state_formula.gather_pool_bytes
        bars = self.browser.attributes('[data-chart="memory"] [data-category="gatherPoolBytes"]',
                                       "data-rank", "data-bytes")
        self.assertEqual(sorted(int(b["data-rank"]) for b in bars), list(range(WORKERS)))
        # The formula marker's tooltip (its SVG <title>) spells the formula.
        formula_text = self.browser.devtools.evaluate(
            "[...document.querySelectorAll('[data-formula-bytes]')].map(e => e.textContent).join(' ')")
        for bar, metrics in zip(sorted(bars, key=lambda b: int(b["data-rank"])), job.rank_progress):
            shown = int(float(bar["data-bytes"]))
            self.assertEqual(shown, metrics.memory.gather_pool_bytes)
            if mode == "ZERO3":
                # The pool never exceeds its bound (sharding::GatherPoolBytes, the plan's figure).
                self.assertGreater(shown, 0)
                self.assertLessEqual(shown, pool_bytes)
            else:
                self.assertEqual(shown, 0)
        if mode == "ZERO3":
            self.assertGreater(pool_bytes, 0)
            self.assertIn("pool (", formula_text)
        else:
            self.assertEqual(pool_bytes, 0)
            self.assertNotIn("pool (", formula_text)

    def test_live_job_shard_map_then_events(self):
        job = self.client.get(self.live.id)
        self.assertEqual(job.state, job_pb2.RUNNING, job.message)
        self.load("#/jobs/" + job.id, "job", "job-live.png")
        wait_until(lambda: self.browser.attributes('[data-chart="shard-map"] [data-rank]', "data-rank"),
                   PAGE_TIMEOUT_S, "the shard map")
        plan = self.client.plan(job.id, include_layout=True)
        ranks = self.browser.attributes('[data-chart="shard-map"] [data-rank]', "data-rank", "data-bytes")
        self.assertEqual(sorted(int(r["data-rank"]) for r in ranks), list(range(plan.world_size)))
        element_bytes = BYTES_PER_PARAM_DTYPE[
            types_pb2.DType.Name(job.spec.precision.param_dtype)]
        self.assertEqual(sum(int(float(r["data-bytes"])) for r in ranks), plan.total_elems * element_bytes)
        self.assertGreater(plan.bucket_count, 1)
        self.assertEqual(self.browser.devtools.evaluate(
            "document.querySelectorAll('[data-chart=\"shard-map\"] [data-bucket]').length"),
            plan.bucket_count * plan.world_size)

        # Ended, the same page shows every step and the checkpoints it committed.
        self.client.cancel(job.id, reason="dashboard test done")
        wait_until(lambda: self.client.get(job.id).state == job_pb2.CANCELLED, JOB_TIMEOUT_S, job.id + " cancelled")
        self.load("#/jobs/" + job.id, "job", "job-cancelled.png")
        points = self.browser.attributes('[data-chart="loss"] [data-point]', "data-point")
        steps = progress_steps(self.client, job.id)
        self.assertEqual(len(points), len(steps))
        events = list(self.client.watch(job.id, timeout=JOB_TIMEOUT_S))
        shown_types = self.browser.devtools.evaluate(
            "[...document.querySelectorAll('.events tbody tr')].map(tr => tr.cells[2].textContent)")
        self.assertEqual(shown_types, [job_pb2.JobEventType.Name(e.type) for e in events
                                       if e.type != job_pb2.PROGRESS])
        self.assertIn("CHECKPOINT_COMMITTED", shown_types)

    def test_compare_overlays_jobs(self):
        ids = [self.finished["DDP"].id, self.finished["ZERO2"].id, self.finished["ZERO3"].id]
        self.load("#/compare?jobs=" + ",".join(ids), "compare", "compare.png")
        points = self.browser.attributes('[data-chart="loss"] [data-point]', "data-point")
        self.assertEqual(len(points), sum(len(progress_steps(self.client, i)) for i in ids))
        bars = self.browser.attributes('[data-chart="memory"] [data-category]',
                                       "data-job", "data-rank", "data-category", "data-bytes")
        for job_id in ids:
            self.check_memory(self.client.get(job_id), bars, job_attr=job_id)
        # Each job's ZeRO formula marker is its plan's.
        markers = self.browser.attributes("[data-formula-bytes]", "data-formula-bytes")
        self.assertEqual({int(float(m["data-formula-bytes"])) for m in markers},
                         {formula_total(self.client.plan(i)) for i in ids})


def formula_total(plan):
    """The ZeRO formula's bytes per rank the plan carries (ShardPlan.model_state_formula)."""
    f = plan.model_state_formula
    total = (f.params_bytes + f.grads_bytes + f.master_bytes + f.optimizer_state_bytes
             + f.gather_pool_bytes)  # the pool: zero3 only
    assert total > 0 and total == int(total), total  # whole bytes for the seed model at W = 2
    return int(total)


def spec(name, mode, steps, **overrides):
    result = {
        "name": name,
        "workload": {"preset": "seed"},
        "optimizer": {"kind": "ADAMW", "lr": 0.01},
        "mode": mode,
        "steps": steps,
        "minWorkers": WORKERS,
    }
    result.update(overrides)
    return result


if __name__ == "__main__":
    unittest.main()
