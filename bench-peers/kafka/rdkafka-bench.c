/* librdkafka against a broker speaking Kafka (mmmq's --kafka-listen), as a Kafka user runs it:
 * the client's defaults (acks=all, its own batching), one JSON line per run.
 *
 *   produce  BOOTSTRAP TOPIC SECONDS BYTES   one producer as fast as librdkafka batches; rate of
 *                                           acknowledged records (flush included)
 *   consume  BOOTSTRAP TOPIC COUNT           reads COUNT stored records from the start of every
 *                                           partition; rate from first record to last
 *   latency  BOOTSTRAP TOPIC SECONDS RATE    one producer (linger.ms=0) sending RATE records a
 *                                           second, stamped; a consumer of the same topic times
 *                                           send to receipt
 *
 * Built and run by scripts/bench-peers (docs/benchmarks.md, "Kafka clients"). */
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void die(const char *what, const char *why) {
    fprintf(stderr, "rdkafka-bench: %s: %s\n", what, why);
    exit(1);
}

static rd_kafka_conf_t *conf_for(const char *bootstrap) {
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof err) != RD_KAFKA_CONF_OK)
        die("bootstrap.servers", err);
    return conf;
}

static void set(rd_kafka_conf_t *conf, const char *key, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(conf, key, value, err, sizeof err) != RD_KAFKA_CONF_OK) die(key, err);
}

static long long delivered, failed;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (m->err) {
        if (failed++ == 0) fprintf(stderr, "rdkafka-bench: %s\n", rd_kafka_err2str(m->err));
    } else {
        delivered++;
    }
}

static rd_kafka_t *producer(const char *bootstrap, const char *linger_ms) {
    char err[512];
    rd_kafka_conf_t *conf = conf_for(bootstrap);
    set(conf, "acks", "all");
    if (linger_ms) set(conf, "linger.ms", linger_ms);
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk) die("producer", err);
    return rk;
}

static int produce(const char *bootstrap, const char *topic, int seconds, int bytes) {
    rd_kafka_t *rk = producer(bootstrap, NULL);
    char *payload = malloc(bytes);
    memset(payload, 'x', bytes);
    char key[32];
    long long sent = 0, start = now_us(), until = start + (long long)seconds * 1000000;
    while (now_us() < until) {
        for (int i = 0; i < 1000; i++) {
            int n = snprintf(key, sizeof key, "k%lld", sent % 1024);
            rd_kafka_resp_err_t e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, n),
                RD_KAFKA_V_VALUE(payload, bytes), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                RD_KAFKA_V_END);
            if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                rd_kafka_poll(rk, 1);
                i--;
                continue;
            }
            if (e) die("produce", rd_kafka_err2str(e));
            sent++;
        }
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_flush(rk, 60000);
    double elapsed = (now_us() - start) / 1e6;
    printf("{\"bench\":\"peers\",\"what\":\"produce\",\"system\":\"mmmq-kafka\",\"client\":\"librdkafka %s\","
           "\"message_bytes\":%d,\"msgs_per_s\":%.0f,\"acknowledged\":%lld,\"failed\":%lld}\n",
           rd_kafka_version_str(), bytes, delivered / elapsed, delivered, failed);
    rd_kafka_destroy(rk);
    return failed != 0 || delivered != sent;
}

/* Every partition of `topic`, from its first record. */
static rd_kafka_t *consumer_from(const char *bootstrap, const char *topic, long long offset) {
    char err[512];
    rd_kafka_conf_t *conf = conf_for(bootstrap);
    set(conf, "group.id", "rdkafka-bench");
    set(conf, "enable.auto.commit", "false");
    set(conf, "fetch.wait.max.ms", "10");
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk) die("consumer", err);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md;
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, t, &md, 10000);
    if (e || md->topic_cnt != 1 || md->topics[0].err) die("metadata", rd_kafka_err2str(e));
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(md->topics[0].partition_cnt);
    for (int p = 0; p < md->topics[0].partition_cnt; p++)
        rd_kafka_topic_partition_list_add(parts, topic, md->topics[0].partitions[p].id)->offset = offset;
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(t);
    if ((e = rd_kafka_assign(rk, parts))) die("assign", rd_kafka_err2str(e));
    rd_kafka_topic_partition_list_destroy(parts);
    return rk;
}

static int consume(const char *bootstrap, const char *topic, long long count) {
    rd_kafka_t *rk = consumer_from(bootstrap, topic, RD_KAFKA_OFFSET_BEGINNING);
    long long got = 0, bytes = 0, first = 0, waited = now_us();
    while (got < count) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) {
            if (now_us() - waited > 30000000) die("consume", "no record for 30 s");
            continue;
        }
        waited = now_us();
        if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (got++ == 0) first = now_us();
            bytes += m->len;
        } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            die("consume", rd_kafka_message_errstr(m));
        }
        rd_kafka_message_destroy(m);
    }
    double elapsed = (now_us() - first) / 1e6;
    printf("{\"bench\":\"peers\",\"what\":\"consume\",\"system\":\"mmmq-kafka\",\"client\":\"librdkafka %s\","
           "\"records\":%lld,\"msgs_per_s\":%.0f,\"mb_per_s\":%.1f}\n",
           rd_kafka_version_str(), got, got / elapsed, bytes / elapsed / 1e6);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return 0;
}

struct pacer {
    const char *bootstrap, *topic;
    int seconds, rate;
    long long sent;
};

/* Sends `rate` stamped records a second, one at a time (linger.ms=0), for `seconds`. */
static void *pace(void *arg) {
    struct pacer *p = arg;
    rd_kafka_t *rk = producer(p->bootstrap, "0");
    long long start = now_us(), gap = 1000000 / p->rate;
    char value[64];
    for (long long i = 0; i < (long long)p->seconds * p->rate; i++) {
        long long due = start + i * gap, t;
        while ((t = now_us()) < due) rd_kafka_poll(rk, (int)((due - t) / 1000));
        int n = snprintf(value, sizeof value, "%lld", now_us());
        rd_kafka_resp_err_t e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(p->topic), RD_KAFKA_V_VALUE(value, n),
                                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        if (e) die("produce", rd_kafka_err2str(e));
        p->sent++;
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_flush(rk, 30000);
    rd_kafka_destroy(rk);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static int latency(const char *bootstrap, const char *topic, int seconds, int rate) {
    rd_kafka_t *rk = consumer_from(bootstrap, topic, RD_KAFKA_OFFSET_END);
    /* Let the consumer reach the end before the first record. */
    for (int i = 0; i < 10; i++) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (m) rd_kafka_message_destroy(m);
    }
    struct pacer p = {bootstrap, topic, seconds, rate, 0};
    pthread_t thread;
    pthread_create(&thread, NULL, pace, &p);
    long long total = (long long)seconds * rate, got = 0, waited = now_us();
    long long *lat = malloc(sizeof(long long) * total);
    while (got < total) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) {
            if (now_us() - waited > 30000000) die("latency", "no record for 30 s");
            continue;
        }
        long long at = now_us();
        waited = at;
        if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            char stamp[32] = {0};
            memcpy(stamp, m->payload, m->len < 31 ? m->len : 31);
            lat[got++] = at - atoll(stamp);
        }
        rd_kafka_message_destroy(m);
    }
    pthread_join(thread, NULL);
    qsort(lat, got, sizeof *lat, cmp);
    printf("{\"bench\":\"peers\",\"what\":\"latency\",\"system\":\"mmmq-kafka\",\"client\":\"librdkafka %s\","
           "\"records\":%lld,\"rate_per_s\":%d,\"p50_us\":%lld,\"p99_us\":%lld,\"max_us\":%lld}\n",
           rd_kafka_version_str(), got, rate, lat[got / 2], lat[got * 99 / 100], lat[got - 1]);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "produce")) return produce(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
    if (argc == 5 && !strcmp(argv[1], "consume")) return consume(argv[2], argv[3], atoll(argv[4]));
    if (argc == 6 && !strcmp(argv[1], "latency")) return latency(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
    fprintf(stderr,
            "usage: rdkafka-bench produce BOOTSTRAP TOPIC SECONDS BYTES\n"
            "       rdkafka-bench consume BOOTSTRAP TOPIC COUNT\n"
            "       rdkafka-bench latency BOOTSTRAP TOPIC SECONDS RATE\n");
    return 2;
}
