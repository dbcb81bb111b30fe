// The business application the tests put behind limiter: a real Jetty 9.4
// (Debian's jetty9) with one servlet, started by tests/src/jetty.rs.
//
//   java -cp CLASSES:JARS LimiterUpstream PORT CONTROL_PORT MAX_THREADS
//
// PORT serves HTTP/1.1 to limiter, with Jetty's ForwardedRequestCustomizer
// (as operators run Jetty behind a proxy: it takes Forwarded, X-Forwarded-*,
// X-Proxied-Https, Proxy-ssl-id and Proxy-auth-cert as the proxy's word).
// Every request it serves is recorded (method, target, body length,
// X-Forwarded-For, X-Request-Id) and answered 200 with
// "served METHOD TARGET BODY_LENGTH\n"; before=N holds it N ms before it
// reads the request body (a servlet computing before an upload); ms=N holds the
// request N ms first (a servlet computing: it does not notice a closed
// connection), and bytes=N answers N bytes instead, written in 64 chunks
// spread over the ms. GET /view answers what the servlet API says of the
// request (isSecure, remote address, scheme, server name and port, the SSL
// attributes) and the headers it got, one per line.
// Under /secure/ Jetty's own BasicAuthenticator admits user:pas.
//
// The servlet counts the requests it works on at once (their peak), from
// the start of its service method until just before the last bytes of the
// answer are written,
// and a sampler thread every millisecond the requests queued in Jetty's
// thread pool waiting for a thread (their peak).
//
// CONTROL_PORT is a JDK HttpServer of its own (its requests use none of
// Jetty's threads): GET /served (the records so far, one per line, tab
// separated), GET /stats ("inflight N\npeak N\nqueued_peak N\nserved N\n"),
// POST /reset (clears the records and the peaks). "READY" is printed once
// both listen.

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

import javax.servlet.http.HttpServlet;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;

import org.eclipse.jetty.security.ConstraintMapping;
import org.eclipse.jetty.security.ConstraintSecurityHandler;
import org.eclipse.jetty.security.HashLoginService;
import org.eclipse.jetty.security.UserStore;
import org.eclipse.jetty.security.authentication.BasicAuthenticator;
import org.eclipse.jetty.server.ForwardedRequestCustomizer;
import org.eclipse.jetty.server.HttpConfiguration;
import org.eclipse.jetty.server.HttpConnectionFactory;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;
import org.eclipse.jetty.util.security.Constraint;
import org.eclipse.jetty.util.security.Credential;
import org.eclipse.jetty.util.thread.QueuedThreadPool;

import com.sun.net.httpserver.HttpServer;

public class LimiterUpstream {
    static final List<String> served = new ArrayList<>();
    static final AtomicInteger inflight = new AtomicInteger();
    static final AtomicInteger peak = new AtomicInteger();
    static final AtomicInteger queuedPeak = new AtomicInteger();
    static final AtomicInteger servedCount = new AtomicInteger();

    /// A request the servlet works on: counted from its start until its
    /// work is done, just before the last bytes of its answer are written
    /// (a proxy learns that the work is done from those bytes: the thread
    /// then only returns, and must not count against the next request).
    static final class Working implements AutoCloseable {
        private boolean done;

        Working() {
            int now = inflight.incrementAndGet();
            peak.accumulateAndGet(now, Math::max);
        }

        void done() {
            if (!done) {
                done = true;
                inflight.decrementAndGet();
            }
        }

        @Override
        public void close() {
            done();
        }
    }

    public static class Recording extends HttpServlet {
        @Override
        protected void service(HttpServletRequest req, HttpServletResponse resp) throws IOException {
            try (Working working = new Working()) {
                long length = 0;
                byte[] buf = new byte[8192];
                // before=N: the servlet computes N ms before it reads the body.
                long before = number(req.getParameter("before"));
                if (before > 0) {
                    try {
                        Thread.sleep(before);
                    } catch (InterruptedException e) {
                        // reads at once
                    }
                }
                InputStream in = req.getInputStream();
                for (int n; (n = in.read(buf)) > 0; ) {
                    length += n;
                }
                String target = req.getRequestURI() + (req.getQueryString() == null ? "" : "?" + req.getQueryString());
                String xff = req.getHeader("X-Forwarded-For");
                String id = req.getHeader("X-Request-Id");
                synchronized (served) {
                    served.add(req.getMethod() + "\t" + target + "\t" + length + "\t" + (xff == null ? "-" : xff)
                            + "\t" + (id == null ? "-" : id));
                }
                servedCount.incrementAndGet();
                if (req.getRequestURI().equals("/view")) {
                    view(req, resp, working);
                    return;
                }
                long ms = number(req.getParameter("ms"));
                String bytes = req.getParameter("bytes");
                if (bytes != null) {
                    stream(resp, number(bytes), ms, working);
                    return;
                }
                if (ms > 0) {
                    try {
                        Thread.sleep(ms);
                    } catch (InterruptedException e) {
                        // served at once
                    }
                }
                byte[] body = ("served " + req.getMethod() + " " + target + " " + length + "\n")
                        .getBytes(StandardCharsets.UTF_8);
                resp.setStatus(200);
                resp.setContentType("text/plain");
                resp.setContentLength(body.length);
                working.done();
                resp.getOutputStream().write(body);
            }
        }
    }

    static long number(String text) {
        try {
            return text == null ? 0 : Long.parseLong(text);
        } catch (NumberFormatException e) {
            return 0;
        }
    }

    /// N bytes in 64 chunks, each flushed, spread over ms.
    static void stream(HttpServletResponse resp, long n, long ms, Working working) throws IOException {
        resp.setStatus(200);
        resp.setContentType("application/octet-stream");
        resp.setContentLengthLong(n);
        OutputStream out = resp.getOutputStream();
        byte[] chunk = new byte[(int) Math.max(1, n / 64)];
        long left = n;
        while (left > 0) {
            // The pause comes before a chunk, never after the last: the
            // servlet is done once its last byte is written.
            try {
                Thread.sleep(ms / 64);
            } catch (InterruptedException e) {
                // on at once
            }
            int len = (int) Math.min(chunk.length, left);
            if (len == left) {
                working.done();
            }
            out.write(chunk, 0, len);
            out.flush();
            left -= len;
        }
    }

    static void view(HttpServletRequest req, HttpServletResponse resp, Working working) throws IOException {
        StringBuilder out = new StringBuilder();
        out.append("secure ").append(req.isSecure()).append('\n');
        out.append("remote_addr ").append(req.getRemoteAddr()).append('\n');
        out.append("scheme ").append(req.getScheme()).append('\n');
        out.append("server_name ").append(req.getServerName()).append('\n');
        out.append("server_port ").append(req.getServerPort()).append('\n');
        out.append("ssl_session_id ").append(req.getAttribute("javax.servlet.request.ssl_session_id")).append('\n');
        out.append("cipher_suite ").append(req.getAttribute("javax.servlet.request.cipher_suite")).append('\n');
        out.append("certificate ").append(req.getAttribute("javax.servlet.request.X509Certificate") != null).append('\n');
        for (String name : Collections.list(req.getHeaderNames())) {
            for (String value : Collections.list(req.getHeaders(name))) {
                out.append("header ").append(name.toLowerCase()).append(' ').append(value).append('\n');
            }
        }
        byte[] body = out.toString().getBytes(StandardCharsets.UTF_8);
        resp.setStatus(200);
        resp.setContentType("text/plain");
        resp.setContentLength(body.length);
        working.done();
        resp.getOutputStream().write(body);
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        int control = Integer.parseInt(args[1]);
        int threads = Integer.parseInt(args[2]);
        QueuedThreadPool pool = new QueuedThreadPool(threads, threads);
        Server server = new Server(pool);
        HttpConfiguration http = new HttpConfiguration();
        http.addCustomizer(new ForwardedRequestCustomizer());
        ServerConnector connector = new ServerConnector(server, 1, 1, new HttpConnectionFactory(http));
        connector.setHost("127.0.0.1");
        connector.setPort(port);
        server.addConnector(connector);

        HashLoginService login = new HashLoginService("limiter");
        UserStore users = new UserStore();
        users.addUser("user", Credential.getCredential("pas"), new String[] {"user"});
        login.setUserStore(users);
        server.addBean(login);
        Constraint constraint = new Constraint(Constraint.__BASIC_AUTH, "user");
        constraint.setAuthenticate(true);
        ConstraintMapping mapping = new ConstraintMapping();
        mapping.setPathSpec("/secure/*");
        mapping.setConstraint(constraint);
        ConstraintSecurityHandler security = new ConstraintSecurityHandler();
        security.setAuthenticator(new BasicAuthenticator());
        security.setLoginService(login);
        security.setConstraintMappings(Collections.singletonList(mapping));

        ServletContextHandler context = new ServletContextHandler(ServletContextHandler.SECURITY);
        context.setSecurityHandler(security);
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
