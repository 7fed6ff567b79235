// nats.js against ttlbroker's NATS listener: stream limits and discard policies.
// A stream at max_msgs with discard old keeps the newest; with discard new, and
// with max_bytes, max_msg_size, discard_new_per_subject and max_consumers, the
// refusals carry the server's errors. Usage: node limits.mjs nats://HOST:PORT
import { AckPolicy, connect, DiscardPolicy, StringCodec } from "nats";

const nc = await connect({ servers: process.argv[2] });
const jsm = await nc.jetstreamManager();
const js = nc.jetstream();
const sc = StringCodec();
const out = {};

async function refusal(subject, data) {
  try {
    await js.publish(subject, sc.encode(data));
    return null;
  } catch (err) {
    return { code: err.api_error?.code, err_code: err.api_error?.err_code, description: err.api_error?.description };
  }
}

await jsm.streams.add({ name: "OLD", subjects: ["old.>"], max_msgs: 3 });
for (let i = 0; i < 5; i++) await js.publish(`old.${i}`, sc.encode("x"));
const old = await jsm.streams.info("OLD");
out.old = { messages: old.state.messages, first: old.state.first_seq, last: old.state.last_seq, max_msgs: old.config.max_msgs };

await jsm.streams.add({ name: "NEW", subjects: ["new.>"], max_msgs: 2, discard: DiscardPolicy.New });
await js.publish("new.a", sc.encode("1"));
await js.publish("new.b", sc.encode("2"));
out.max_msgs = await refusal("new.c", "3");

await jsm.streams.add({ name: "BYTES", subjects: ["bytes.>"], max_bytes: 200, discard: DiscardPolicy.New });
await js.publish("bytes.a", sc.encode("x".repeat(50)));
out.max_bytes = await refusal("bytes.a", "x".repeat(150));

await jsm.streams.add({ name: "SIZE", subjects: ["size.>"], max_msg_size: 4 });
out.max_msg_size = await refusal("size.a", "12345");

await jsm.streams.add({
  name: "PER", subjects: ["per.>"], max_msgs_per_subject: 1, discard: DiscardPolicy.New, discard_new_per_subject: true,
});
await js.publish("per.a", sc.encode("1"));
out.per_subject = await refusal("per.a", "2");
out.per_config = (await jsm.streams.info("PER")).config.discard_new_per_subject;

await jsm.streams.add({ name: "MC", subjects: ["mc.>"], max_consumers: 1 });
await jsm.consumers.add("MC", { durable_name: "one", ack_policy: AckPolicy.Explicit });
try {
  await jsm.consumers.add("MC", { durable_name: "two", ack_policy: AckPolicy.Explicit });
  out.max_consumers = null;
} catch (err) {
  out.max_consumers = { code: err.api_error?.code, err_code: err.api_error?.err_code, description: err.api_error?.description };
}
await nc.close();
console.log(JSON.stringify(out));
