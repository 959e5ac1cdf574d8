// Java's HttpClient reads no environment variable: the proxy comes from -Dhttp(s).proxyHost/Port
// (ProxySelector.getDefault()), the CA from -Djavax.net.ssl.trustStore (README client table).
import java.net.ProxySelector;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

public class Fetch {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newBuilder().proxy(ProxySelector.getDefault())
            .connectTimeout(Duration.ofSeconds(30)).build();
        for (String url : args) {
            HttpResponse<byte[]> r = client.send(HttpRequest.newBuilder(URI.create(url)).timeout(Duration.ofSeconds(90)).build(),
                                                 HttpResponse.BodyHandlers.ofByteArray());
            System.out.println(r.statusCode() + " " + r.headers().firstValue("x-etiquette-decision").orElse("-")
                               + " " + r.body().length);
        }
    }
}
