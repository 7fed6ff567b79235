// nats.js against ttlbroker's NATS listener: a durable pull consumer (fetch, ack,
// consumer info) and a KV-style watch with an ordered push consumer.
// Usage: node consumer_kv.mjs nats://HOST:PORT   (prints one JSON object)
import { AckPolicy, connect, consumerOpts, headers, StringCodec } from "nats";

const nc = await connect({ servers: process.argv[2] });
const jsm = await nc.jetstreamManager();
const js = nc.jetstream();
const sc = StringCodec();
const out = {};

await jsm.streams.add({ name: "NJ", subjects: ["nj.>"] });
for (let i = 0; i < 4; i++) await js.publish(`nj.${i}`, sc.encode(`m${i}`));
await jsm.consumers.add("NJ", { durable_name: "work", ack_policy: AckPolicy.Explicit });
out.fetched = [];
// js.fetch (a pull request on CONSUMER.MSG.NEXT): nats.js's newer consumers API
// wants a server version of 2.9.4 or more in INFO, and ttlbroker reports its own.
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

// A KV watch as nats.js's KV does it underneath (js.views.kv wants a server version
// of 2.6.2 or more in INFO, and ttlbroker reports its own): the bucket's stream, puts
// and a delete as publishes, and an ordered push consumer delivering the last
// message per key and then every change.
await jsm.streams.add({
  name: "KV_nodekv", subjects: ["$KV.nodekv.>"], max_msgs_per_subject: 5,
  allow_rollup_hdrs: true, allow_msg_ttl: true, deny_delete: true, allow_direct: true,
});
await js.publish("$KV.nodekv.a", sc.encode("0"));
await js.publish("$KV.nodekv.a", sc.encode("1"));
const opts = consumerOpts();
opts.orderedConsumer();
opts.deliverLastPerSubject();
const sub = await js.subscribe("$KV.nodekv.>", opts);
const seen = [];
const done = (async () => {
  for await (const m of sub) {
    seen.push([m.subject, m.headers?.get("KV-Operation") ?? "PUT", sc.decode(m.data), m.seq, m.info.pending]);
    if (seen.length === 3) sub.unsubscribe();
  }
})();
await js.publish("$KV.nodekv.b", sc.encode("2"));
const del = headers();
del.set("KV-Operation", "DEL");
await js.publish("$KV.nodekv.a", sc.encode(""), { headers: del });
await done;
out.watched = seen;
await nc.close();
console.log(JSON.stringify(out));
