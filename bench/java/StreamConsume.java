// The limit of the RabbitMQ Streams consume rows (bench/streams.py): the official Java
// client (com.rabbitmq:stream-client) reading a stream from its first offset with its
// default settings and a handler that takes each body and counts. Prints the seconds from
// the first message to the COUNT-th (monotonic clock), or exits 1 after TIMEOUT seconds. Run with Java 17's single-file launcher:
//   java -cp '.tools/java/lib/*' bench/java/StreamConsume.java HOST PORT STREAM COUNT TIMEOUT
import com.rabbitmq.stream.Address;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.OffsetSpecification;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

public class StreamConsume {
  public static void main(String[] args) throws Exception {
    String host = args[0];
    int port = Integer.parseInt(args[1]);
    String stream = args[2];
    long count = Long.parseLong(args[3]);
    long timeout = Long.parseLong(args[4]);
    Environment environment = Environment.builder()
        .host(host).port(port)
        .addressResolver(address -> new Address(host, port)) // it may advertise another name
        .build();
    CountDownLatch done = new CountDownLatch(1);
    long[] seen = {0};
    long[] times = {0, 0};
    Consumer consumer = environment.consumerBuilder()
        .stream(stream)
        .offset(OffsetSpecification.first())
        .messageHandler((context, message) -> {
          message.getBodyAsBinary();
          long n = ++seen[0];
          if (n == 1) {
            times[0] = System.nanoTime();
          } else if (n == count) {
            times[1] = System.nanoTime();
            done.countDown();
          }
        })
        .build();
    boolean all = done.await(timeout, TimeUnit.SECONDS);
    if (all) {
      System.out.println((times[1] - times[0]) / 1e9);
    }
    consumer.close();
    environment.close();
    System.exit(all ? 0 : 1);
  }
}
