// The limit of the RabbitMQ Streams publish rows (bench/streams.py): the official Java
// client (com.rabbitmq:stream-client) publishing 100-byte bodies to STREAM for SECONDS
// with its default producer settings, at most WINDOW messages unconfirmed: WINDOW 1 is
// one at a time, 1000 is a thousand at once. With BATCH > 0 it sends BATCH messages and
// waits for every confirmation before the next BATCH (WINDOW is then ignored). Prints
// "confirmed seconds". Run with Java 17's single-file launcher:
//   java -cp '.tools/java/lib/*' bench/java/StreamPublish.java HOST PORT STREAM SECONDS WINDOW BATCH
import com.rabbitmq.stream.Address;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.Producer;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

public class StreamPublish {
  public static void main(String[] args) throws Exception {
    String host = args[0];
    int port = Integer.parseInt(args[1]);
    String stream = args[2];
    double seconds = Double.parseDouble(args[3]);
    int window = Integer.parseInt(args[4]);
    int batch = Integer.parseInt(args[5]);
    Environment environment = Environment.builder()
        .host(host).port(port)
        .addressResolver(address -> new Address(host, port)) // it may advertise another name
        .build();
    environment.streamCreator().stream(stream).create();
    Producer producer = environment.producerBuilder().stream(stream).build();
    byte[] body = new byte[100];
    java.util.Arrays.fill(body, (byte) 'x');
    AtomicLong confirmed = new AtomicLong();
    // Warm-up: the JIT and the connection, as every contender gets its own.
    send(producer, body, confirmed, 1000);
    confirmed.set(0);
    long started = System.nanoTime();
    long until = started + (long) (seconds * 1e9);
    if (batch > 0) {
      while (System.nanoTime() < until) {
        send(producer, body, confirmed, batch);
      }
    } else {
      Semaphore room = new Semaphore(window);
      while (System.nanoTime() < until) {
        room.acquire();
        producer.send(producer.messageBuilder().addData(body).build(), status -> {
          if (status.isConfirmed()) confirmed.incrementAndGet();
          room.release();
        });
      }
      room.acquire(window);
    }
    double elapsed = (System.nanoTime() - started) / 1e9;
    System.out.println(confirmed.get() + " " + elapsed);
    producer.close();
    environment.close();
    System.exit(0);
  }

  static void send(Producer producer, byte[] body, AtomicLong confirmed, int count)
      throws InterruptedException {
    CountDownLatch latch = new CountDownLatch(count);
    for (int i = 0; i < count; i++) {
      producer.send(producer.messageBuilder().addData(body).build(), status -> {
        if (status.isConfirmed()) confirmed.incrementAndGet();
        latch.countDown();
      });
    }
    if (!latch.await(60, TimeUnit.SECONDS)) throw new IllegalStateException("no confirms");
  }
}
