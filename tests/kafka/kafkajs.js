// kafkajs (its own protocol code, in JavaScript) against mmmq, for tests/tests/kafka_clients.rs:
//   node kafkajs.js BOOTSTRAP TOPIC N
// Makes TOPIC with 3 partitions (CreateTopics), sends N keyed records with a header from an
// idempotent producer (acks=all), consumes them in the group "kjs-group" (committing as it
// goes), then reads the group's commits and the group list back. Prints one line per fact:
//   rec PARTITION OFFSET KEY VALUE HEADER   committed PARTITION OFFSET   group ID   ok
// kafkajs comes from the npm registry: ./scripts/test installs it (MMMQ_KAFKAJS_NODE_PATH).
const { Kafka, logLevel } = require('kafkajs');

const [bootstrap, topic, n] = [process.argv[2], process.argv[3], Number(process.argv[4])];
const kafka = new Kafka({ clientId: 'kafkajs-test', brokers: [bootstrap], logLevel: logLevel.ERROR });

(async () => {
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 3 }], waitForLeaders: true });
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const messages = [];
  for (let i = 0; i < n; i++) {
    messages.push({ key: `k${i % 7}`, value: `v${i}`, headers: { h: `x${i}` } });
  }
  // In batches of 100, each acknowledged before the next (acks=all).
  for (let i = 0; i < n; i += 100) {
    await producer.send({ topic, acks: -1, messages: messages.slice(i, i + 100) });
  }
  await producer.disconnect();
  const consumer = kafka.consumer({ groupId: 'kjs-group' });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  await new Promise((resolve) => {
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        const h = message.headers.h ? message.headers.h.toString() : '-';
        console.log(`rec ${partition} ${message.offset} ${message.key} ${message.value} ${h}`);
        seen += 1;
        if (seen === n) resolve();
      },
    });
  });
  // Disconnecting commits what was consumed.
  await consumer.disconnect();
  const offsets = await admin.fetchOffsets({ groupId: 'kjs-group', topics: [topic] });
  for (const t of offsets) {
    for (const p of t.partitions) console.log(`committed ${p.partition} ${p.offset}`);
  }
  const { groups } = await admin.listGroups();
  for (const g of groups) console.log(`group ${g.groupId}`);
  await admin.disconnect();
  console.log('ok');
})().catch((e) => {
  console.error('kafkajs failed:', e);
  process.exit(1);
});
