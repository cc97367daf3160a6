// Reads a RabbitMQ stream with the official Java client (com.rabbitmq:stream-client) and
// prints each message body as one line of UTF-8, from the first offset, until COUNT
// messages came or TIMEOUT seconds passed (exit 1 then). Run with Java 17's single-file
// launcher: java -cp '.tools/java/lib/*' tests/admin/StreamRead.java HOST PORT VHOST USER PASSWORD STREAM COUNT TIMEOUT
import com.rabbitmq.stream.Address;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.OffsetSpecification;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

public class StreamRead {
  public static void main(String[] args) throws Exception {
    String host = args[0];
    int port = Integer.parseInt(args[1]);
    int count = Integer.parseInt(args[6]);
    Environment environment = Environment.builder()
        .host(host).port(port).virtualHost(args[2]).username(args[3]).password(args[4])
        .addressResolver(address -> new Address(host, port)) // the broker may advertise another name
        .build();
    CountDownLatch latch = new CountDownLatch(count);
    Consumer consumer = environment.consumerBuilder()
        .stream(args[5])
        .offset(OffsetSpecification.first())
        .messageHandler((context, message) -> {
          synchronized (System.out) {
            System.out.println(new String(message.getBodyAsBinary(), StandardCharsets.UTF_8));
            System.out.flush();
          }
          latch.countDown();
        })
        .build();
    boolean all = latch.await(Long.parseLong(args[7]), TimeUnit.SECONDS);
    consumer.close();
    environment.close();
    System.exit(all ? 0 : 1);
  }
}
