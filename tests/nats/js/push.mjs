// nats.js against ttlbroker's NATS listener: push consumers with acks, as nats.js
// makes them (js.subscribe with consumerOpts): a durable one with manual acks, and a
// queue group of two subscriptions sharing one durable with a deliver group.
// Usage: node push.mjs nats://HOST:PORT   (prints one JSON object)
import { connect, consumerOpts, createInbox, StringCodec } from "nats";

const nc = await connect({ servers: process.argv[2] });
const jsm = await nc.jetstreamManager();
const js = nc.jetstream();
const sc = StringCodec();
const out = {};

await jsm.streams.add({ name: "NP", subjects: ["np.>"] });
for (let i = 0; i < 4; i++) await js.publish(`np.a.${i}`, sc.encode(`m${i}`));

const opts = consumerOpts();
opts.durable("push");
opts.manualAck();
opts.ackExplicit();
opts.deliverTo(createInbox());
opts.filterSubject("np.a.>");
const sub = await js.subscribe("np.a.>", opts);
out.got = [];
for await (const m of sub) {
  out.got.push([m.subject, sc.decode(m.data), m.info.deliveryCount]);
  m.ack();
  if (out.got.length === 4) break;
}
await nc.flush();
const ci = await jsm.consumers.info("NP", "push");
out.info = { num_ack_pending: ci.num_ack_pending, num_pending: ci.num_pending, push_bound: ci.push_bound ?? false };

const seen = { a: [], b: [] };
const workers = [];
for (const name of ["a", "b"]) {
  const q = consumerOpts();
  q.durable("workers");
  q.queue("workers");
  q.manualAck();
  q.ackExplicit();
  q.deliverTo("deliver.np.workers");
  q.filterSubject("np.j.>");
  const s = await js.subscribe("np.j.>", q);
  workers.push((async () => {
    for await (const m of s) {
      seen[name].push(sc.decode(m.data));
      m.ack();
      if (seen.a.length + seen.b.length === 40) { break; }
    }
  })());
}
for (let i = 0; i < 40; i++) await js.publish(`np.j.${i}`, sc.encode(`j${i}`));
const timeout = new Promise((resolve) => setTimeout(resolve, 5000));
await Promise.race([Promise.any(workers), timeout]);
out.jobs = seen;
const wi = await jsm.consumers.info("NP", "workers");
out.workers = { deliver_group: wi.config.deliver_group, delivered: wi.delivered.stream_seq };
await nc.close();
console.log(JSON.stringify(out));
