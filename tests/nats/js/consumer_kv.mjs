// nats.js against ttlbroker's NATS listener: a durable pull consumer (fetch, ack,
// consumer info) and nats.js's KV API (put, get, delete, watch).
// Usage: node consumer_kv.mjs nats://HOST:PORT   (prints one JSON object)
import { AckPolicy, connect, StringCodec } from "nats";

const nc = await connect({ servers: process.argv[2] });
const jsm = await nc.jetstreamManager();
const js = nc.jetstream();
const sc = StringCodec();
const out = {};

await jsm.streams.add({ name: "NJ", subjects: ["nj.>"] });
for (let i = 0; i < 4; i++) await js.publish(`nj.${i}`, sc.encode(`m${i}`));
await jsm.consumers.add("NJ", { durable_name: "work", ack_policy: AckPolicy.Explicit });
out.fetched = [];
// js.fetch (a pull request on CONSUMER.MSG.NEXT).
const iter = js.fetch("NJ", "work", { batch: 3, expires: 2000 });
for await (const m of iter) {
  out.fetched.push([m.subject, sc.decode(m.data), m.seq, m.info.deliveryCount, m.info.pending]);
  await m.ackAck();
}
const ci = await jsm.consumers.info("NJ", "work");
out.info = {
  delivered: [ci.delivered.consumer_seq, ci.delivered.stream_seq],
  ack_floor: [ci.ack_floor.consumer_seq, ci.ack_floor.stream_seq],
  num_pending: ci.num_pending, num_ack_pending: ci.num_ack_pending,
};

// nats.js's own KV API (js.views.kv): a bucket made through it, puts, and a watch
// that gets the last value of each key and then every change, a delete included.
const kv = await js.views.kv("nodekv", { history: 5 });
await kv.put("a", sc.encode("0"));
await kv.put("a", sc.encode("1"));
const watch = await kv.watch();
const seen = [];
const done = (async () => {
  for await (const e of watch) {
    seen.push([e.key, e.operation, sc.decode(e.value), e.revision, e.delta]);
    if (seen.length === 3) watch.stop();
  }
})();
await kv.put("b", sc.encode("2"));
await kv.delete("a");
await done;
out.got = [sc.decode((await kv.get("b")).value), await kv.get("a").then((e) => e?.operation ?? null)];
out.watched = seen;
await nc.close();
console.log(JSON.stringify(out));
