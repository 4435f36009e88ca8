// BullMQ for Node under the benchmark's protocol (see ../README.md and ../systems/_common.py).
//
// benchmarks/systems/bullmq_node.py drives this script; it is not run by hand.
//
//   node bench.mjs producer --url redis://...   reads one JSON request per line on stdin
//                                               and answers one JSON line per request
//   node bench.mjs worker --mode process|latency --config '{...}'
//                                               prints {"event":"started"}, then the same
//                                               "result" record as _common.worker_main
//
// The timed enqueue loops run here, in the process that enqueues, so that neither the
// pipe to Python nor Python's CPU is in any figure. Times given back to Python are
// seconds: wall-clock ones (time.time()'s scale) from performance.timeOrigin + now().
import { createInterface } from "node:readline";
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

const QUEUE = "bench";

function connection(url) {
  const u = new URL(url);
  if (u.protocol !== "redis:") throw new Error(`only redis:// URLs are supported, got ${url}`);
  const db = Number((u.pathname || "/0").slice(1) || 0);
  return {
    host: u.hostname || "127.0.0.1",
    port: Number(u.port || 6379),
    db,
    ...(u.username ? { username: decodeURIComponent(u.username) } : {}),
    ...(u.password ? { password: decodeURIComponent(u.password) } : {}),
  };
}

const wallNow = () => (performance.timeOrigin + performance.now()) / 1000;
const cpuSeconds = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
const emit = (record) => process.stdout.write(JSON.stringify(record) + "\n");

// N lanes, each awaiting one call at a time, sharing one index stream (gather_enqueue)
async function lanes(indices, width, call) {
  let next = 0;
  const lane = async () => {
    while (next < indices.length) {
      await call(indices[next++]);
    }
  };
  await Promise.all(Array.from({ length: width }, lane));
}

// ---------------------------------------------------------------------------- producer

async function producer(url) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.waitUntilReady();
  const enqueue = (i) => queue.add("noop", { i });
  const ops = {
    async enqueue({ i }) {
      await enqueue(i);
      return {};
    },
    async timed({ indices, callers }) {
      const latencies = [];
      const cpu0 = cpuSeconds();
      const t0 = performance.now();
      await lanes(indices, callers, async (i) => {
        const start = performance.now();
        await enqueue(i);
        latencies.push((performance.now() - start) / 1000);
      });
      return {
        seconds: (performance.now() - t0) / 1000,
        cpu_s: cpuSeconds() - cpu0,
        latencies,
      };
    },
    async fast({ indices, batch_size: batchSize }) {
      const size = batchSize || indices.length;
      const cpu0 = cpuSeconds();
      const t0 = performance.now();
      for (let start = 0; start < indices.length; start += size) {
        await queue.addBulk(
          indices.slice(start, start + size).map((i) => ({ name: "noop", data: { i } })),
        );
      }
      return { seconds: (performance.now() - t0) / 1000, cpu_s: cpuSeconds() - cpu0, errors: 0 };
    },
    async paced({ warmup, indices, interval, idle }) {
      for (const i of warmup) {
        await enqueue(i);
        await sleep(interval * 1000);
      }
      await sleep(idle * 1000);
      const sent = {};
      let tick = performance.now();
      for (const i of indices) {
        const before = wallNow();
        await enqueue(i);
        sent[i] = [before, wallNow()];
        tick += interval * 1000;
        await sleep(tick - performance.now());
      }
      return { sent };
    },
  };
  emit({ event: "ready" });
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const request = JSON.parse(line);
    if (request.op === "close") break;
    const op = ops[request.op];
    if (!op) {
      emit({ error: `unknown op ${request.op}` });
      continue;
    }
    try {
      emit(await op(request));
    } catch (err) {
      emit({ error: String(err && err.stack ? err.stack : err) });
    }
  }
  lines.close();
  process.stdin.destroy();
  await queue.close();
}

// ---------------------------------------------------------------------------- worker

const OWN_COMMANDS = new Set(["info", "config|resetstat", "config"]);

function parseInfo(text) {
  const out = {};
  for (const line of text.split(/\r?\n/)) {
    if (!line || line.startsWith("#") || !line.includes(":")) continue;
    const at = line.indexOf(":");
    out[line.slice(0, at)] = line.slice(at + 1);
  }
  return out;
}

class RedisMeter {
  constructor(redis) {
    this.redis = redis;
    this.cpu0 = 0;
  }
  async cpu() {
    const info = parseInfo(await this.redis.info("cpu"));
    return Number(info.used_cpu_sys) + Number(info.used_cpu_user);
  }
  async start() {
    await this.redis.config("RESETSTAT");
    this.cpu0 = await this.cpu();
  }
  async stop() {
    const cpu = (await this.cpu()) - this.cpu0;
    const entries = [];
    for (const [key, value] of Object.entries(parseInfo(await this.redis.info("commandstats")))) {
      const name = key.replace(/^cmdstat_/, "");
      if (OWN_COMMANDS.has(name)) continue;
      const calls = /(?:^|,)calls=(\d+)/.exec(value);
      entries.push([name, calls ? Number(calls[1]) : 0]);
    }
    entries.sort((a, b) => b[1] - a[1]);
    const byCommand = Object.fromEntries(entries);
    const commands = entries.reduce((sum, [, calls]) => sum + calls, 0);
    return { redis_cpu_s: cpu, commands, by_command: byCommand };
  }
}

async function worker(mode, cfg) {
  const n = mode === "process" ? cfg.n : cfg.latency_n + cfg.latency_warmup;
  const flags = new Uint8Array(n);
  const starts = mode === "latency" ? {} : null;
  let calls = 0;
  let distinct = 0;
  let unexpected = 0;
  let doneAt = 0;
  let resolveDone;
  const done = new Promise((resolve) => {
    resolveDone = resolve;
  });
  const onTask = (i) => {
    if (starts !== null && !(i in starts)) starts[i] = wallNow();
    calls += 1;
    if (!(Number.isInteger(i) && i >= 0 && i < n)) {
      unexpected += 1;
      return;
    }
    if (!flags[i]) {
      flags[i] = 1;
      distinct += 1;
      if (distinct === n) {
        doneAt = performance.now();
        resolveDone();
      }
    }
  };

  const probe = new IORedis(connection(cfg.url));
  const meter = new RedisMeter(probe);
  await meter.start();
  const cpu0 = cpuSeconds();
  const t0 = performance.now();
  const bull = new Worker(
    QUEUE,
    async (job) => {
      onTask(job.data.i);
    },
    { connection: connection(cfg.url), concurrency: cfg.concurrency },
  );
  let workerError = null;
  bull.on("error", (err) => {
    workerError = workerError || String(err);
  });
  await sleep(50);
  emit({ event: "started" });

  const timeout = cfg.timeout || 60 + Math.max(cfg.n, cfg.latency_n) / 200;
  let timer;
  const timedOut = await Promise.race([
    done.then(() => false),
    new Promise((resolve) => {
      timer = setTimeout(() => resolve(true), timeout * 1000);
    }),
  ]);
  clearTimeout(timer);
  const end = timedOut ? performance.now() : doneAt;
  if (!timedOut) {
    // late duplicates still count; the last acknowledgements are in the CPU and commands
    await sleep(cfg.settle * 1000);
  }
  const endCpu = cpuSeconds();
  const stats = await meter.stop();
  let error = workerError;
  try {
    await bull.close();
  } catch (err) {
    error = error || String(err);
  }
  await probe.quit();
  const result = {
    event: "result",
    mode,
    n,
    seconds: (end - t0) / 1000,
    worker_cpu_s: endCpu - cpu0,
    handler_calls: calls,
    distinct,
    unexpected,
    timed_out: timedOut,
    error,
    ...stats,
  };
  if (starts !== null) result.starts = starts;
  emit(result);
}

// ---------------------------------------------------------------------------- entry

function option(args, name) {
  const at = args.indexOf(name);
  if (at < 0 || at + 1 >= args.length) throw new Error(`missing ${name}`);
  return args[at + 1];
}

const [role, ...rest] = process.argv.slice(2);
if (role === "producer") {
  await producer(option(rest, "--url"));
} else if (role === "worker") {
  await worker(option(rest, "--mode"), JSON.parse(option(rest, "--config")));
} else {
  process.stderr.write("usage: node bench.mjs producer --url URL | worker --mode M --config JSON\n");
  process.exit(2);
}
