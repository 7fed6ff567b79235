// nats.js against ttlbroker's NATS listener: a stream with per-message TTLs, a
// publish with Nats-TTL, the stored message read back, and the refusals.
// Usage: node ttl_publish.mjs nats://HOST:PORT   (prints one JSON object)
import { connect, headers, StringCodec } from "nats";

const nc = await connect({ servers: process.argv[2] });
const jsm = await nc.jetstreamManager();
const js = nc.jetstream();
const sc = StringCodec();
const out = {};
await jsm.streams.add({ name: "NODE", subjects: ["node.>"], allow_msg_ttl: true });
await jsm.streams.add({ name: "NOTTL", subjects: ["nottl.>"] });

const h = headers();
h.set("Nats-TTL", "1m30s");
const ack = await js.publish("node.a", sc.encode("hello"), { headers: h });
out.ack = { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate };
const m = await jsm.streams.getMessage("NODE", { seq: ack.seq });
out.stored = { subject: m.subject, data: sc.decode(m.data), ttl: m.header.get("Nats-TTL") };

async function refusal(subject, ttl) {
  const hh = headers();
  hh.set("Nats-TTL", ttl);
  try {
    await js.publish(subject, sc.encode("x"), { headers: hh });
    return null;
  } catch (err) {
    return { code: err.api_error?.code, err_code: err.api_error?.err_code, description: err.api_error?.description };
  }
}
out.invalid = await refusal("node.b", "abc");
out.disabled = await refusal("nottl.b", "30s");
await nc.close();
console.log(JSON.stringify(out));
