// The C client (libnats) as a load generator for bench/nats_c.py: one workload
// against one NATS server, timed by the client itself.
//
// Usage: nats_c_load URL WORKLOAD COUNT SIZE [PARAM [MAX_SECONDS]]
//        nats_c_load --version   (prints "libnats X.Y.Z")
//
//   pub       core publish of COUNT messages of SIZE bytes on bench.core, one
//             subscriber on its own connection counting them (pending limits off, as
//             `nats bench sub` sets them); the time is the subscriber's, from its
//             first message to its last (as `nats bench sub` measures it)
//   req       COUNT sequential natsConnection_Request on bench.req; a responder on
//             its own connection answers each with SIZE bytes
//   js_pub    the stream BENCH (subject bench.js, file storage) is created, then
//             COUNT js_PublishAsync with PARAM (default 4,000) in flight
//             (jsOptions.PublishAsync.MaxPending), until js_PublishAsyncComplete;
//             the stream must then hold COUNT messages
//   js_fetch  a durable pull consumer PULL on BENCH (explicit acks, max ack pending
//             PARAM, default 1,000, as `nats bench js fetch` makes it), then
//             natsSubscription_Fetch of PARAM and natsMsg_Ack of each, until COUNT
//             messages (what js_pub stored) have come
//   kv_put    the bucket bench (history 1) is created, then COUNT sequential
//             kvStore_Put of keys "0".."COUNT-1"
//   kv_get    COUNT sequential kvStore_Get of those keys, each value checked
//
// MAX_SECONDS (req, js_pub, kv_put; default none): start no new operation after
// that long (a slow disk under sync_interval: always; js_pub still waits for the
// acks of those in flight); the result counts what was done, not what was asked
// ("messages" below COUNT, no errors for the rest).
// js_fetch and kv_get are then given what js_pub and kv_put stored.
//
// Once connected and set up it prints "ready" on stdout and waits for a line on
// stdin (so that the caller reads the server's CPU time just before the clock
// starts), runs the workload, and prints one JSON object:
//   {"workload": ..., "messages": N, "seconds": S, "errors": E, "detail": "..."}
// "messages" is what was done (received, answered, acked, stored, read back right);
// "errors" what was not. A setup that fails prints {"error": "..."} and exits 1.
#include <nats/nats.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STREAM "BENCH"
#define JS_SUBJECT "bench.js"
#define BUCKET "bench"

static const char *workload;
static double max_seconds;  // 0: no limit

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

// MAX_SECONDS have passed since t0 (checked every 64 operations).
static bool out_of_time(long long i, double t0)
{
    return max_seconds > 0 && (i & 63) == 0 && now() - t0 > max_seconds;
}

// `s` as a JSON string (quotes, backslashes and control characters escaped).
static void json_string(const char *s)
{
    putchar('"');
    for (; s != NULL && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void fail(const char *what, natsStatus s, jsErrCode jerr)
{
    char text[512];
    const char *last = nats_GetLastError(NULL);
    snprintf(text, sizeof text, "%s %s: %s (status %d, JetStream error %d)%s%s", workload, what,
             natsStatus_GetText(s), (int)s, (int)jerr, last ? " " : "", last ? last : "");
    printf("{\"error\": ");
    json_string(text);
    printf("}\n");
    fflush(stdout);
    exit(1);
}

static void check(natsStatus s, jsErrCode jerr, const char *what)
{
    if (s != NATS_OK)
        fail(what, s, jerr);
}

static natsConnection *connect_to(const char *url, bool send_asap)
{
    natsOptions *opts = NULL;
    natsConnection *nc = NULL;
    check(natsOptions_Create(&opts), 0, "natsOptions_Create");
    check(natsOptions_SetURL(opts, url), 0, "natsOptions_SetURL");
    check(natsOptions_SetMaxReconnect(opts, 0), 0, "natsOptions_SetMaxReconnect");
    // Sequential workloads: each request leaves at once instead of when the
    // library's flusher thread gets to it.
    check(natsOptions_SetSendAsap(opts, send_asap), 0, "natsOptions_SetSendAsap");
    check(natsConnection_Connect(&nc, opts), 0, "natsConnection_Connect");
    natsOptions_Destroy(opts);
    return nc;
}

// "ready", then wait for the caller's go (a line on stdin).
static void ready(void)
{
    char line[16];
    printf("ready\n");
    fflush(stdout);
    if (fgets(line, sizeof line, stdin) == NULL) {
        printf("{\"error\": \"stdin closed before the go\"}\n");
        exit(1);
    }
}

static void result(long long messages, double seconds, long long errors, const char *detail)
{
    printf("{\"workload\": \"%s\", \"messages\": %lld, \"seconds\": %.6f, \"errors\": %lld, \"detail\": ",
           workload, messages, seconds, errors);
    json_string(detail);
    printf("}\n");
    fflush(stdout);
}

// -- core publish ---------------------------------------------------------------------

static atomic_llong received;
static _Atomic double first_at, last_at;

static void on_core(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    double t = now();
    if (atomic_fetch_add(&received, 1) == 0)
        first_at = t;
    last_at = t;
    natsMsg_Destroy(msg);
}

static void core_publish(const char *url, long long count, const char *payload, int size)
{
    natsConnection *sc = connect_to(url, false), *pc = connect_to(url, false);
    natsSubscription *sub = NULL;
    char detail[128];
    check(natsConnection_Subscribe(&sub, sc, "bench.core", on_core, NULL), 0, "natsConnection_Subscribe");
    check(natsSubscription_SetPendingLimits(sub, -1, -1), 0, "natsSubscription_SetPendingLimits");
    check(natsConnection_Flush(sc), 0, "natsConnection_Flush (subscriber)");  // the server has the SUB
    ready();
    double t0 = now();
    for (long long i = 0; i < count; i++)
        check(natsConnection_Publish(pc, "bench.core", payload, size), 0, "natsConnection_Publish");
    check(natsConnection_FlushTimeout(pc, 60000), 0, "natsConnection_Flush (publisher)");
    double published = now() - t0;
    // Until all have come, or nothing has for 5 s (the rest is lost).
    long long seen = -1;
    double quiet_since = now();
    while (atomic_load(&received) < count) {
        long long n = atomic_load(&received);
        if (n != seen) {
            seen = n;
            quiet_since = now();
        } else if (now() - quiet_since > 5.0) {
            break;
        }
        nats_Sleep(1);
    }
    long long got = atomic_load(&received);
    snprintf(detail, sizeof detail, "published %lld in %.3f s", count, published);
    result(got, got > 1 ? last_at - first_at : 0.0, count - got, detail);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(pc);
    natsConnection_Destroy(sc);
}

// -- request/reply --------------------------------------------------------------------

typedef struct {
    natsConnection *nc;
    const char *payload;
    int size;
} responder;

static void on_request(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    responder *r = closure;
    const char *reply = natsMsg_GetReply(msg);
    if (reply != NULL)
        natsConnection_Publish(r->nc, reply, r->payload, r->size);
    natsMsg_Destroy(msg);
}

static void request_reply(const char *url, long long count, const char *payload, int size)
{
    responder r = {connect_to(url, true), payload, size};
    natsConnection *nc = connect_to(url, true);
    natsSubscription *sub = NULL;
    long long ok = 0, errors = 0, asked = count;
    char detail[160] = "";
    check(natsConnection_Subscribe(&sub, r.nc, "bench.req", on_request, &r), 0, "natsConnection_Subscribe");
    check(natsConnection_Flush(r.nc), 0, "natsConnection_Flush (responder)");
    natsMsg *warm = NULL;  // the requester's reply subscription exists before the clock
    check(natsConnection_Request(&warm, nc, "bench.req", payload, size, 5000), 0, "natsConnection_Request (warm-up)");
    natsMsg_Destroy(warm);
    ready();
    double t0 = now();
    for (long long i = 0; i < count && errors < 10; i++) {
        if (out_of_time(i, t0)) {
            count = i;
            break;
        }
        natsMsg *reply = NULL;
        natsStatus s = natsConnection_Request(&reply, nc, "bench.req", payload, size, 5000);
        if (s == NATS_OK && natsMsg_GetDataLength(reply) == size) {
            ok++;
        } else {
            errors++;
            if (!detail[0])
                snprintf(detail, sizeof detail, "request %lld: %s", i, natsStatus_GetText(s));
        }
        natsMsg_Destroy(reply);
    }
    if (count < asked && !detail[0])
        snprintf(detail, sizeof detail, "stopped after %g s", max_seconds);
    result(ok, now() - t0, count - ok, detail);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    natsConnection_Destroy(r.nc);
}

// -- JetStream ------------------------------------------------------------------------

static atomic_llong pub_errors;
static char pub_error[160];

static void on_pub_error(jsCtx *js, jsPubAckErr *pae, void *closure)
{
    if (atomic_fetch_add(&pub_errors, 1) == 0)
        snprintf(pub_error, sizeof pub_error, "%s (JetStream error %d)", pae->ErrText ? pae->ErrText : "",
                 (int)pae->ErrCode);
}

static jsCtx *jetstream(natsConnection *nc, long long max_pending)
{
    jsCtx *js = NULL;
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = 30000;
    o.PublishAsync.MaxPending = max_pending;
    o.PublishAsync.StallWait = 60000;  // a full window waits for acks, it is not an error
    o.PublishAsync.ErrHandler = on_pub_error;
    check(natsConnection_JetStream(&js, nc, &o), 0, "natsConnection_JetStream");
    return js;
}

static void js_publish(const char *url, long long count, const char *payload, int size, long long in_flight)
{
    natsConnection *nc = connect_to(url, false);
    jsCtx *js = jetstream(nc, in_flight);
    jsStreamConfig cfg;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    const char *subjects[] = {JS_SUBJECT};
    char detail[256] = "";
    jsStreamConfig_Init(&cfg);
    cfg.Name = STREAM;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Storage = js_FileStorage;
    check(js_AddStream(&si, js, &cfg, NULL, &jerr), jerr, "js_AddStream");
    jsStreamInfo_Destroy(si);
    ready();
    double t0 = now();
    long long asked = count;
    for (long long i = 0; i < count; i++) {
        if (out_of_time(i, t0)) {
            count = i;
            break;
        }
        natsStatus s = js_PublishAsync(js, JS_SUBJECT, payload, size, NULL);
        if (s != NATS_OK)
            fail("js_PublishAsync", s, 0);
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 60000;
    check(js_PublishAsyncComplete(js, &po), 0, "js_PublishAsyncComplete");
    double seconds = now() - t0;
    check(js_GetStreamInfo(&si, js, STREAM, NULL, &jerr), jerr, "js_GetStreamInfo");
    long long stored = (long long)si->State.Msgs;
    jsStreamInfo_Destroy(si);
    long long errors = atomic_load(&pub_errors);
    snprintf(detail, sizeof detail, "stream holds %lld%s%s%s", stored, count < asked ? " (stopped at the time limit)" : "",
             errors ? "; first error: " : "", pub_error);
    long long ok = stored < count - errors ? stored : count - errors;
    result(ok, seconds, count - ok, detail);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

static void js_fetch(const char *url, long long count, int batch)
{
    natsConnection *nc = connect_to(url, false);
    jsCtx *js = jetstream(nc, 4000);
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsErrCode jerr = 0;
    long long done = 0, errors = 0;
    char detail[160] = "";
    jsSubOptions_Init(&so);
    so.Stream = STREAM;
    so.Config.AckPolicy = js_AckExplicit;
    so.Config.MaxAckPending = batch;
    check(js_PullSubscribe(&sub, js, JS_SUBJECT, "PULL", NULL, &so, &jerr), jerr, "js_PullSubscribe");
    ready();
    double t0 = now();
    while (done < count) {
        natsMsgList list = {0};
        int want = count - done < batch ? (int)(count - done) : batch;
        natsStatus s = natsSubscription_Fetch(&list, sub, want, 10000, &jerr);
        if (s != NATS_OK && list.Count == 0) {
            snprintf(detail, sizeof detail, "fetch after %lld: %s (JetStream error %d)", done, natsStatus_GetText(s),
                     (int)jerr);
            errors = count - done;
            break;
        }
        for (int i = 0; i < list.Count; i++) {
            if (natsMsg_Ack(list.Msgs[i], NULL) == NATS_OK)
                done++;
            else
                errors++;
        }
        natsMsgList_Destroy(&list);
    }
    // The last acks reach the server before the clock stops.
    check(natsConnection_Flush(nc), 0, "natsConnection_Flush");
    result(done, now() - t0, errors, detail);
    natsSubscription_Destroy(sub);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

// -- KV -------------------------------------------------------------------------------

static void kv(const char *url, long long count, const char *payload, int size, bool put)
{
    natsConnection *nc = connect_to(url, true);
    jsCtx *js = jetstream(nc, 4000);
    kvStore *kv = NULL;
    long long ok = 0, errors = 0, asked = count;
    char key[32], detail[160] = "";
    if (put) {
        kvConfig cfg;
        kvConfig_Init(&cfg);
        cfg.Bucket = BUCKET;
        cfg.History = 1;
        check(js_CreateKeyValue(&kv, js, &cfg), 0, "js_CreateKeyValue");
    } else {
        check(js_KeyValue(&kv, js, BUCKET), 0, "js_KeyValue");
    }
    ready();
    double t0 = now();
    for (long long i = 0; i < count && errors < 10; i++) {
        natsStatus s;
        if (put && out_of_time(i, t0)) {
            count = i;
            break;
        }
        snprintf(key, sizeof key, "%lld", i);
        if (put) {
            uint64_t rev = 0;
            s = kvStore_Put(&rev, kv, key, payload, size);
            if (s == NATS_OK)
                ok++;
        } else {
            kvEntry *e = NULL;
            s = kvStore_Get(&e, kv, key);
            if (s == NATS_OK && kvEntry_ValueLen(e) == size && memcmp(kvEntry_Value(e), payload, size) == 0) {
                ok++;
            } else if (s == NATS_OK) {
                errors++;
                if (!detail[0])
                    snprintf(detail, sizeof detail, "key %s: a wrong value of %d bytes", key, kvEntry_ValueLen(e));
            }
            kvEntry_Destroy(e);
        }
        if (s != NATS_OK) {
            errors++;
            if (!detail[0])
                snprintf(detail, sizeof detail, "key %s: %s", key, natsStatus_GetText(s));
        }
    }
    if (count < asked && !detail[0])
        snprintf(detail, sizeof detail, "stopped after %g s", max_seconds);
    result(ok, now() - t0, count - ok, detail);
    kvStore_Destroy(kv);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("libnats %s\n", nats_GetVersion());
        return 0;
    }
    if (argc < 5 || argc > 7) {
        fprintf(stderr, "usage: %s URL pub|req|js_pub|js_fetch|kv_put|kv_get COUNT SIZE [PARAM [MAX_SECONDS]]\n",
                argv[0]);
        return 2;
    }
    const char *url = argv[1];
    workload = argv[2];
    long long count = atoll(argv[3]);
    int size = atoi(argv[4]);
    long long param = argc >= 6 ? atoll(argv[5]) : 0;
    max_seconds = argc == 7 ? atof(argv[6]) : 0;
    if (count < 1 || size < 0 || param < 0 || max_seconds < 0) {
        fprintf(stderr, "COUNT must be at least 1, SIZE, PARAM and MAX_SECONDS at least 0\n");
        return 2;
    }
    char *payload = malloc(size ? size : 1);
    for (int i = 0; i < size; i++)
        payload[i] = (char)('a' + i % 26);
    if (strcmp(workload, "pub") == 0)
        core_publish(url, count, payload, size);
    else if (strcmp(workload, "req") == 0)
        request_reply(url, count, payload, size);
    else if (strcmp(workload, "js_pub") == 0)
        js_publish(url, count, payload, size, param ? param : 4000);
    else if (strcmp(workload, "js_fetch") == 0)
        js_fetch(url, count, param ? (int)param : 1000);
    else if (strcmp(workload, "kv_put") == 0)
        kv(url, count, payload, size, true);
    else if (strcmp(workload, "kv_get") == 0)
        kv(url, count, payload, size, false);
    else {
        fprintf(stderr, "unknown workload %s\n", workload);
        return 2;
    }
    free(payload);
    nats_Close();
    return 0;
}
