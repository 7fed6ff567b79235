// nats.js against ttlbroker's NATS listener: a memory stream (publish, get, a
// durable pull consumer, stream info), a KV bucket on memory, and the refusal of an
// update that changes the storage.
// Usage: node memory.mjs nats://HOST:PORT   (prints one JSON object)
import { AckPolicy, connect, StorageType, StringCodec } from "nats";

const nc = await connect({ servers: process.argv[2] });
const jsm = await nc.jetstreamManager();
const js = nc.jetstream();
const sc = StringCodec();
const out = {};

const si = await jsm.streams.add({ name: "NMEM", subjects: ["nmem.>"], storage: StorageType.Memory });
out.storage = si.config.storage;
out.seqs = [];
for (let i = 0; i < 5; i++) out.seqs.push((await js.publish(`nmem.${i % 2}`, sc.encode(`m${i}`))).seq);
const m = await jsm.streams.getMessage("NMEM", { last_by_subj: "nmem.0" });
out.last = [m.seq, sc.decode(m.data)];
await jsm.consumers.add("NMEM", { durable_name: "work", ack_policy: AckPolicy.Explicit });
out.fetched = [];
for await (const msg of js.fetch("NMEM", "work", { batch: 5, expires: 2000 })) {
  out.fetched.push([msg.seq, sc.decode(msg.data)]);
  await msg.ackAck();
}
const info = await jsm.streams.info("NMEM");
out.state = [info.state.messages, info.state.first_seq, info.state.last_seq];

const kv = await js.views.kv("nodemem", { storage: StorageType.Memory });
await kv.put("k", sc.encode("v"));
out.kv = [sc.decode((await kv.get("k")).value), (await jsm.streams.info("KV_nodemem")).config.storage];

try {
  await jsm.streams.update("NMEM", { ...si.config, storage: StorageType.File });
  out.update = null;
} catch (err) {
  out.update = { code: err.api_error?.code, err_code: err.api_error?.err_code, description: err.api_error?.description };
}
await nc.close();
console.log(JSON.stringify(out));
