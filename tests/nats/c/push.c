// The C client (libnats) against a NATS server: push consumers as js_SubscribeSync
// makes them. Usage: push nats://HOST:PORT   (prints one JSON object on stdout)
//
// - a durable push consumer with manual explicit acks;
// - an ephemeral one with ack policy none, and one with ack policy all;
// - a queue group of two subscriptions on a work-queue stream;
// - an ordered consumer over 1,024 messages of 1 KiB (flow control, heartbeats);
// - a durable whose deliver subject nobody hears: nothing is delivered until a
//   subscription binds to it.
// Any failed call prints {"error": "..."} and exits 1.
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(natsStatus s, jsErrCode jerr, const char *what)
{
    if (s == NATS_OK)
        return;
    printf("{\"error\": \"%s: %s (%d) %s\"}\n", what, natsStatus_GetText(s), (int)jerr, nats_GetLastError(NULL));
    exit(1);
}

static jsCtx *js;
static natsConnection *nc;

static void add_stream(const char *name, const char *subject, jsRetentionPolicy retention)
{
    jsStreamConfig cfg;
    jsErrCode jerr = 0;
    const char *subjects[] = {subject};
    jsStreamConfig_Init(&cfg);
    cfg.Name = name;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Retention = retention;
    check(js_AddStream(NULL, js, &cfg, NULL, &jerr), jerr, "js_AddStream");
}

static void publish(const char *subject, const char *data, int len)
{
    jsErrCode jerr = 0;
    check(js_Publish(NULL, js, subject, data, len, NULL, &jerr), jerr, "js_Publish");
}

static jsConsumerInfo *info(const char *stream, const char *consumer)
{
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    check(js_GetConsumerInfo(&ci, js, stream, consumer, NULL, &jerr), jerr, "js_GetConsumerInfo");
    return ci;
}

// Receive `count` messages on `sub`, printing [subject, data, delivery count] for
// each as a JSON array. `ack`: 0 no acks; 1 natsMsg_Ack each, the last with
// natsMsg_AckSync; 2 natsMsg_AckSync on the last only.
static void receive(natsSubscription *sub, int count, int ack)
{
    printf("[");
    for (int i = 0; i < count; i++) {
        natsMsg *m = NULL;
        jsMsgMetaData *meta = NULL;
        jsErrCode jerr = 0;
        check(natsSubscription_NextMsg(&m, sub, 5000), 0, "natsSubscription_NextMsg");
        check(natsMsg_GetMetaData(&meta, m), 0, "natsMsg_GetMetaData");
        printf("%s[\"%s\", \"%.*s\", %llu]", i ? ", " : "", natsMsg_GetSubject(m),
               natsMsg_GetDataLength(m), natsMsg_GetData(m), (unsigned long long)meta->NumDelivered);
        if (ack == 1 && i < count - 1)
            check(natsMsg_Ack(m, NULL), 0, "natsMsg_Ack");
        if (ack != 0 && i == count - 1)
            check(natsMsg_AckSync(m, NULL, &jerr), jerr, "natsMsg_AckSync");
        jsMsgMetaData_Destroy(meta);
        natsMsg_Destroy(m);
    }
    printf("]");
}

int main(int argc, char **argv)
{
    jsErrCode jerr = 0;
    char buf[1024];
    if (argc != 2) {
        fprintf(stderr, "usage: %s nats://HOST:PORT\n", argv[0]);
        return 2;
    }
    check(natsConnection_ConnectTo(&nc, argv[1]), 0, "natsConnection_ConnectTo");
    check(natsConnection_JetStream(&js, nc, NULL), 0, "natsConnection_JetStream");
    add_stream("CP", "cp.>", js_LimitsPolicy);
    for (int i = 0; i < 4; i++) {
        snprintf(buf, sizeof buf, "m%d", i);
        publish(i % 2 ? "cp.a.odd" : "cp.a.even", buf, (int)strlen(buf));
    }
    printf("{");

    // A durable push consumer with explicit acks, acked one by one.
    jsSubOptions so;
    natsSubscription *durable = NULL;
    jsSubOptions_Init(&so);
    so.ManualAck = true;
    so.Config.Durable = "push";
    so.Config.AckPolicy = js_AckExplicit;
    check(js_SubscribeSync(&durable, js, "cp.a.>", NULL, &so, &jerr), jerr, "js_SubscribeSync durable");
    printf("\"durable\": ");
    receive(durable, 4, 1);
    jsConsumerInfo *ci = info("CP", "push");
    printf(", \"durable_info\": {\"num_ack_pending\": %lld, \"num_pending\": %llu, \"push_bound\": %s, \"ack_floor\": %llu}",
           (long long)ci->NumAckPending, (unsigned long long)ci->NumPending, ci->PushBound ? "true" : "false",
           (unsigned long long)ci->AckFloor.Stream);
    jsConsumerInfo_Destroy(ci);
    natsSubscription_Destroy(durable);

    // Ephemerals: ack policy none, then all (one AckSync on the last message).
    natsSubscription *none = NULL, *all = NULL;
    jsSubOptions_Init(&so);
    so.Config.AckPolicy = js_AckNone;
    check(js_SubscribeSync(&none, js, "cp.a.even", NULL, &so, &jerr), jerr, "js_SubscribeSync none");
    printf(", \"ack_none\": ");
    receive(none, 2, 0);
    jsSubOptions_Init(&so);
    so.ManualAck = true;
    so.Config.AckPolicy = js_AckAll;
    check(js_SubscribeSync(&all, js, "cp.a.>", NULL, &so, &jerr), jerr, "js_SubscribeSync all");
    printf(", \"ack_all\": ");
    receive(all, 4, 2);
    jsConsumerInfo *ai = NULL;
    check(natsSubscription_GetConsumerInfo(&ai, all, NULL, &jerr), jerr, "natsSubscription_GetConsumerInfo");
    printf(", \"ack_all_info\": {\"num_ack_pending\": %lld, \"ack_floor\": %llu}", (long long)ai->NumAckPending,
           (unsigned long long)ai->AckFloor.Stream);
    jsConsumerInfo_Destroy(ai);
    natsSubscription_Destroy(none);
    natsSubscription_Destroy(all);

    // A queue group of two on a work-queue stream: each job to one member, and the
    // stream empty once all are acked.
    add_stream("CJ", "cj.>", js_WorkQueuePolicy);
    natsSubscription *w[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        jsSubOptions_Init(&so);
        so.Queue = "workers";
        so.ManualAck = true;
        so.Config.Durable = "workers";
        check(js_SubscribeSync(&w[k], js, "cj.>", NULL, &so, &jerr), jerr, "js_SubscribeSync queue");
    }
    for (int i = 0; i < 40; i++) {
        snprintf(buf, sizeof buf, "j%d", i);
        publish("cj.job", buf, (int)strlen(buf));
    }
    int seen[2] = {0, 0}, total = 0, overlap = 0;
    char got[40] = {0};
    for (int rounds = 0; total < 40 && rounds < 400; rounds++) {
        for (int k = 0; k < 2; k++) {
            natsMsg *m = NULL;
            if (natsSubscription_NextMsg(&m, w[k], 50) != NATS_OK)
                continue;
            int j = atoi(natsMsg_GetData(m) + 1);
            if (j >= 0 && j < 40) {
                overlap += got[j];
                got[j] = 1;
            }
            check(natsMsg_AckSync(m, NULL, &jerr), jerr, "natsMsg_AckSync job");
            seen[k]++;
            total++;
            natsMsg_Destroy(m);
        }
    }
    jsStreamInfo *si = NULL;
    check(js_GetStreamInfo(&si, js, "CJ", NULL, &jerr), jerr, "js_GetStreamInfo");
    printf(", \"queue\": {\"a\": %d, \"b\": %d, \"overlap\": %d, \"stream_msgs\": %llu}", seen[0], seen[1], overlap,
           (unsigned long long)si->State.Msgs);
    jsStreamInfo_Destroy(si);
    natsSubscription_Destroy(w[0]);
    natsSubscription_Destroy(w[1]);

    // An ordered consumer over 1,024 messages of 1 KiB.
    add_stream("CO", "co.>", js_LimitsPolicy);
    memset(buf, 'x', sizeof buf);
    for (int i = 0; i < 1024; i++)
        check(js_PublishAsync(js, "co.big", buf, sizeof buf, NULL), 0, "js_PublishAsync");
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 10000;
    check(js_PublishAsyncComplete(js, &po), 0, "js_PublishAsyncComplete");
    natsSubscription *ordered = NULL;
    jsSubOptions_Init(&so);
    so.Ordered = true;
    check(js_SubscribeSync(&ordered, js, "co.big", NULL, &so, &jerr), jerr, "js_SubscribeSync ordered");
    int count = 0, bytes = 0;
    for (natsMsg *m = NULL; count < 1024 && natsSubscription_NextMsg(&m, ordered, 5000) == NATS_OK; m = NULL) {
        count++;
        bytes += natsMsg_GetDataLength(m);
        natsMsg_Destroy(m);
    }
    printf(", \"ordered\": {\"count\": %d, \"bytes\": %d}", count, bytes);
    natsSubscription_Destroy(ordered);

    // A durable whose deliver subject nobody hears: nothing goes out, nothing is
    // lost; a subscriber to the deliver subject then gets the message.
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = "later";
    cc.DeliverSubject = "dlv.later";
    cc.FilterSubject = "cp.b";
    cc.AckPolicy = js_AckExplicit;
    check(js_AddConsumer(NULL, js, "CP", &cc, NULL, &jerr), jerr, "js_AddConsumer");
    publish("cp.b", "late", 4);
    check(natsConnection_Flush(nc), 0, "natsConnection_Flush");
    ci = info("CP", "later");
    printf(", \"unheard\": {\"delivered\": %llu, \"num_pending\": %llu, \"num_ack_pending\": %lld}",
           (unsigned long long)ci->Delivered.Stream, (unsigned long long)ci->NumPending,
           (long long)ci->NumAckPending);
    jsConsumerInfo_Destroy(ci);
    natsSubscription *later = NULL;
    jsSubOptions_Init(&so);
    so.Stream = "CP";
    so.Consumer = "later";
    so.ManualAck = true;
    check(js_SubscribeSync(&later, js, "cp.b", NULL, &so, &jerr), jerr, "js_SubscribeSync bind");
    printf(", \"heard\": ");
    receive(later, 1, 2);
    ci = info("CP", "later");
    printf(", \"heard_info\": {\"num_ack_pending\": %lld, \"ack_floor\": %llu}", (long long)ci->NumAckPending,
           (unsigned long long)ci->AckFloor.Stream);
    jsConsumerInfo_Destroy(ci);
    natsSubscription_Destroy(later);

    printf("}\n");
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    nats_Close();
    return 0;
}
