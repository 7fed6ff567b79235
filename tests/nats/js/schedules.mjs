// nats.js against a NATS listener: message schedules (ADR-51). A stream with
// allow_msg_schedules, a one-off schedule due already (it fires at once), its produced
// message read back, a repeating one, and the refusals.
// Usage: node schedules.mjs nats://HOST:PORT   (prints one JSON object)
import { connect, headers, StringCodec } from "nats";

const nc = await connect({ servers: process.argv[2] });
const jsm = await nc.jetstreamManager();
const js = nc.jetstream();
const sc = StringCodec();
const out = {};
const si = await jsm.streams.add({ name: "SCHED", subjects: ["sched.>"], allow_msg_schedules: true, allow_msg_ttl: true });
out.config = { allow_msg_schedules: si.config.allow_msg_schedules, allow_rollup_hdrs: si.config.allow_rollup_hdrs,
               level: si.config.metadata?.["_nats.req.level"] };
await jsm.streams.add({ name: "PLAIN", subjects: ["plain.>"] });

function hdrs(pairs) {
  const h = headers();
  for (const [k, v] of Object.entries(pairs)) h.set(k, v);
  return h;
}
const ack = await js.publish("sched.once", sc.encode("payload"), {
  headers: hdrs({ "Nats-Schedule": "@at 2020-01-01T00:00:00Z", "Nats-Schedule-Target": "sched.out", "Nats-Schedule-TTL": "5m" }),
});
out.ack = { stream: ack.stream, seq: ack.seq };
let state;
for (let i = 0; i < 100; i++) {
  state = (await jsm.streams.info("SCHED", { subjects_filter: ">" })).state;
  if (state.subjects && state.subjects["sched.out"] && !state.subjects["sched.once"]) break;
  await new Promise((r) => setTimeout(r, 50));
}
out.subjects = state.subjects;
const m = await jsm.streams.getMessage("SCHED", { last_by_subj: "sched.out" });
out.produced = { subject: m.subject, data: sc.decode(m.data), scheduler: m.header.get("Nats-Scheduler"),
                 next: m.header.get("Nats-Schedule-Next"), ttl: m.header.get("Nats-TTL"), after: m.seq > ack.seq };
await js.publish("sched.tick", sc.encode("t"), {
  headers: hdrs({ "Nats-Schedule": "@every 1h", "Nats-Schedule-Target": "sched.ticks" }),
});

async function refusal(subject, pairs) {
  try {
    await js.publish(subject, sc.encode("x"), { headers: hdrs(pairs) });
    return null;
  } catch (err) {
    return { code: err.api_error?.code, err_code: err.api_error?.err_code, description: err.api_error?.description };
  }
}
out.disabled = await refusal("plain.a", { "Nats-Schedule": "@every 1m", "Nats-Schedule-Target": "plain.b" });
out.pattern = await refusal("sched.a", { "Nats-Schedule": "@every 1ms", "Nats-Schedule-Target": "sched.b" });
out.target = await refusal("sched.a", { "Nats-Schedule": "@hourly", "Nats-Schedule-Target": "other.b" });
out.zone = await refusal("sched.a", { "Nats-Schedule": "0 0 9 * * *", "Nats-Schedule-Time-Zone": "Nowhere/City", "Nats-Schedule-Target": "sched.b" });
await nc.close();
console.log(JSON.stringify(out));
