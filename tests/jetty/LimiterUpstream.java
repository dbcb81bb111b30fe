// The business application the tests put behind limiter: a real Jetty 9.4
// (Debian's jetty9) with one servlet, started by tests/src/jetty.rs.
//
//   java -cp CLASSES:JARS LimiterUpstream PORT CONTROL_PORT MAX_THREADS
//
// PORT serves HTTP/1.1 to limiter. Every request it serves is recorded
// (method, target, body length, X-Forwarded-For) and answered 200 with
// "served METHOD TARGET BODY_LENGTH\n"; a query parameter ms=N holds the
// request N ms first. The servlet counts requests in its service method at
// once (their peak), and a sampler thread every millisecond the requests
// queued in Jetty's thread pool waiting for a thread (their peak).
//
// CONTROL_PORT is a JDK HttpServer of its own (its requests use none of
// Jetty's threads): GET /served (the records so far, one per line, tab
// separated: method, target, body length, X-Forwarded-For), GET /stats
// ("inflight N\npeak N\nqueued_peak N\nserved N\n"), POST /reset (clears
// the records and the peaks). "READY" is printed once both listen.

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

import javax.servlet.http.HttpServlet;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;

import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;
import org.eclipse.jetty.util.thread.QueuedThreadPool;

import com.sun.net.httpserver.HttpServer;

public class LimiterUpstream {
    static final List<String> served = new ArrayList<>();
    static final AtomicInteger inflight = new AtomicInteger();
    static final AtomicInteger peak = new AtomicInteger();
    static final AtomicInteger queuedPeak = new AtomicInteger();
    static final AtomicInteger servedCount = new AtomicInteger();

    public static class Recording extends HttpServlet {
        @Override
        protected void service(HttpServletRequest req, HttpServletResponse resp) throws IOException {
            int now = inflight.incrementAndGet();
            peak.accumulateAndGet(now, Math::max);
            try {
                long length = 0;
                byte[] buf = new byte[8192];
                InputStream in = req.getInputStream();
                for (int n; (n = in.read(buf)) > 0; ) {
                    length += n;
                }
                String target = req.getRequestURI() + (req.getQueryString() == null ? "" : "?" + req.getQueryString());
                String xff = req.getHeader("X-Forwarded-For");
                synchronized (served) {
                    served.add(req.getMethod() + "\t" + target + "\t" + length + "\t" + (xff == null ? "-" : xff));
                }
                servedCount.incrementAndGet();
                String ms = req.getParameter("ms");
                if (ms != null) {
                    try {
                        Thread.sleep(Long.parseLong(ms));
                    } catch (InterruptedException | NumberFormatException e) {
                        // served at once
                    }
                }
                byte[] body = ("served " + req.getMethod() + " " + target + " " + length + "\n")
                        .getBytes(StandardCharsets.UTF_8);
                resp.setStatus(200);
                resp.setContentType("text/plain");
                resp.setContentLength(body.length);
                resp.getOutputStream().write(body);
            } finally {
                inflight.decrementAndGet();
            }
        }
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        int control = Integer.parseInt(args[1]);
        int threads = Integer.parseInt(args[2]);
        QueuedThreadPool pool = new QueuedThreadPool(threads, threads);
        Server server = new Server(pool);
        ServerConnector connector = new ServerConnector(server, 1, 1);
        connector.setHost("127.0.0.1");
        connector.setPort(port);
        server.addConnector(connector);
        ServletContextHandler context = new ServletContextHandler();
        context.addServlet(new ServletHolder(new Recording()), "/*");
        server.setHandler(context);
        server.start();

        Thread sampler = new Thread(() -> {
            while (true) {
                queuedPeak.accumulateAndGet(pool.getQueueSize(), Math::max);
                try {
                    Thread.sleep(1);
                } catch (InterruptedException e) {
                    return;
                }
            }
        });
        sampler.setDaemon(true);
        sampler.start();

        HttpServer ctl = HttpServer.create(new InetSocketAddress("127.0.0.1", control), 16);
        ctl.createContext("/served", ex -> {
            StringBuilder out = new StringBuilder();
            synchronized (served) {
                for (String line : served) {
                    out.append(line).append('\n');
                }
            }
            reply(ex, out.toString());
        });
        ctl.createContext("/stats", ex -> reply(ex, "inflight " + inflight.get() + "\npeak " + peak.get()
                + "\nqueued_peak " + queuedPeak.get() + "\nserved " + servedCount.get() + "\n"));
        ctl.createContext("/reset", ex -> {
            synchronized (served) {
                served.clear();
            }
            peak.set(inflight.get());
            queuedPeak.set(0);
            servedCount.set(0);
            reply(ex, "reset\n");
        });
        ctl.start();
        System.out.println("READY");
        System.out.flush();
        server.join();
    }

    static void reply(com.sun.net.httpserver.HttpExchange ex, String text) throws IOException {
        byte[] body = text.getBytes(StandardCharsets.UTF_8);
        ex.sendResponseHeaders(200, body.length);
        try (OutputStream out = ex.getResponseBody()) {
            out.write(body);
        }
    }
}
