package outboxbench;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.util.Iterator;
import java.util.Properties;
import org.apache.spark.api.java.function.ForeachPartitionFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.postgresql.Driver;
import org.postgresql.PGConnection;
import org.postgresql.copy.CopyIn;

/**
 * The bench's JVM ceiling (bench/bench_sink.py): every partition streams its rows
 * into one binary COPY from the executor's JVM and commits on its own. No Python,
 * no checks, no dedup, no marker: the fastest Spark writer into PostgreSQL that
 * this machine can run. All columns are strings; column {@code jsonb} is sent as
 * jsonb (version byte 1, then the text), the others as text.
 */
public final class CopyWriter {
  private static final byte[] HEADER = {
    'P', 'G', 'C', 'O', 'P', 'Y', '\n', (byte) 0xff, '\r', '\n', 0, 0, 0, 0, 0, 0, 0, 0, 0
  };
  private static final int FLUSH_BYTES = 1 << 20;

  private CopyWriter() {}

  public static void write(Dataset<Row> rows, String url, String copySql, int jsonb) {
    rows.foreachPartition(
        (ForeachPartitionFunction<Row>) partition -> copy(partition, url, copySql, jsonb));
  }

  static void copy(Iterator<Row> rows, String url, String copySql, int jsonb) throws Exception {
    // The driver directly: DriverManager does not see a driver from spark.jars' loader.
    try (Connection conn = new Driver().connect(url, new Properties())) {
      conn.setAutoCommit(false);
      CopyIn copy = conn.unwrap(PGConnection.class).getCopyAPI().copyIn(copySql);
      ByteArrayOutputStream buffer = new ByteArrayOutputStream(FLUSH_BYTES + (1 << 16));
      DataOutputStream out = new DataOutputStream(buffer);
      out.write(HEADER);
      while (rows.hasNext()) {
        Row row = rows.next();
        int fields = row.length();
        out.writeShort(fields);
        for (int i = 0; i < fields; i++) {
          field(out, row.getString(i), i == jsonb);
        }
        if (buffer.size() >= FLUSH_BYTES) {
          copy.writeToCopy(buffer.toByteArray(), 0, buffer.size());
          buffer.reset();
        }
      }
      out.writeShort(-1);
      copy.writeToCopy(buffer.toByteArray(), 0, buffer.size());
      copy.endCopy();
      conn.commit();
    }
  }

  private static void field(DataOutputStream out, String value, boolean jsonb) throws IOException {
    if (value == null) {
      out.writeInt(-1);
      return;
    }
    byte[] data = value.getBytes(StandardCharsets.UTF_8);
    if (jsonb) {
      out.writeInt(data.length + 1);
      out.writeByte(1);
    } else {
      out.writeInt(data.length);
    }
    out.write(data);
  }
}
