// The soak run's view of Kafka transactions, through the Admin API of the broker's own kafka-clients jar.
//
//   javac -cp '<kafka libs>/*' -d CLASSES benchmarks/SoakTransactions.java
//   java -cp 'CLASSES:<kafka libs>/*' SoakTransactions CLIENT.properties TOPIC[,TOPIC...]
//
// Why not kafka-transactions.sh: its class (org.apache.kafka.tools.TransactionsCommand) is in the kafka-tools
// jar, which the broker's pinned jar set (controlmsg/clusters/kafka-jars.lock) does not hold; confluent-kafka
// 2.16 has no list/describe transactions call. The same requests, from kafka-clients, which is in the set:
//
//  * listTransactions + describeTransactions: every transaction the coordinator knows, its state, its
//    partitions and when it started (what `kafka-transactions.sh list` and `describe` show);
//  * describeProducers on every partition of TOPIC: the producers with a transaction open on that partition
//    (currentTransactionStartOffset), which is what `kafka-transactions.sh find-hanging` starts from. A
//    partition's open transaction whose producer has no Ongoing transaction at the coordinator that holds
//    this partition is reported as "hanging" (find-hanging also waits for the transaction timeout; the
//    caller sees the age and decides).
//
// Prints one JSON object on stdout; exit 1 with the error on stderr.

import java.io.FileInputStream;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;

public class SoakTransactions {
    private static String str(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            props.load(in);
        }
        props.putIfAbsent("request.timeout.ms", "20000");
        props.putIfAbsent("default.api.timeout.ms", "30000");
        List<String> topics = new ArrayList<>();
        for (String t : args.length > 1 ? args[1].split(",") : new String[0]) {
            if (!t.isEmpty()) topics.add(t);
        }
        StringBuilder out = new StringBuilder("{\"transactions\": [");
        Set<String> ongoing = new HashSet<>();  // "producerId/topic/partition" the coordinator holds open
        try (Admin admin = Admin.create(props)) {
            Collection<TransactionListing> listed = admin.listTransactions().all().get(30, TimeUnit.SECONDS);
            List<String> ids = new ArrayList<>();
            for (TransactionListing l : listed) ids.add(l.transactionalId());
            Map<String, TransactionDescription> described = ids.isEmpty() ? Map.of()
                : admin.describeTransactions(ids).all().get(30, TimeUnit.SECONDS);
            // After the answers, not before: a transaction that began while the JVM started would look negative.
            long now = System.currentTimeMillis();
            boolean first = true;
            for (Map.Entry<String, TransactionDescription> e : described.entrySet()) {
                TransactionDescription d = e.getValue();
                String state = d.state().toString();
                long start = d.transactionStartTimeMs().orElse(-1L);
                StringBuilder parts = new StringBuilder();
                for (TopicPartition tp : d.topicPartitions()) {
                    if (parts.length() > 0) parts.append(",");
                    parts.append(str(tp.topic() + "-" + tp.partition()));
                    if (state.equals("Ongoing")) ongoing.add(d.producerId() + "/" + tp.topic() + "/" + tp.partition());
                }
                out.append(first ? "" : ", ").append("{\"id\": ").append(str(e.getKey()))
                    .append(", \"state\": ").append(str(state))
                    .append(", \"producerId\": ").append(d.producerId())
                    .append(", \"ageMs\": ").append(start < 0 ? "null" : String.valueOf(now - start))
                    .append(", \"timeoutMs\": ").append(d.transactionTimeoutMs())
                    .append(", \"partitions\": [").append(parts).append("]}");
                first = false;
            }
            out.append("], \"openOnPartitions\": [");
            List<TopicPartition> tps = new ArrayList<>();
            if (!topics.isEmpty()) {
                Map<String, TopicDescription> desc = admin.describeTopics(topics).allTopicNames().get(30, TimeUnit.SECONDS);
                for (TopicDescription td : desc.values()) {
                    for (TopicPartitionInfo p : td.partitions()) tps.add(new TopicPartition(td.name(), p.partition()));
                }
            }
            first = true;
            if (!tps.isEmpty()) {
                Map<TopicPartition, PartitionProducerState> states =
                    admin.describeProducers(tps).all().get(30, TimeUnit.SECONDS);
                for (Map.Entry<TopicPartition, PartitionProducerState> e : states.entrySet()) {
                    TopicPartition tp = e.getKey();
                    for (ProducerState p : e.getValue().activeProducers()) {
                        if (p.currentTransactionStartOffset().isEmpty()) continue;
                        boolean known = ongoing.contains(p.producerId() + "/" + tp.topic() + "/" + tp.partition());
                        out.append(first ? "" : ", ").append("{\"partition\": ").append(str(tp.topic() + "-" + tp.partition()))
                            .append(", \"producerId\": ").append(p.producerId())
                            .append(", \"startOffset\": ").append(p.currentTransactionStartOffset().getAsLong())
                            .append(", \"lastWriteAgeMs\": ").append(now - p.lastTimestamp())
                            .append(", \"hanging\": ").append(!known).append("}");
                        first = false;
                    }
                }
            }
            out.append("]}");
        }
        System.out.println(out);
    }
}
