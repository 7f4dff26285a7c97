// SPDX-License-Identifier: Apache-2.0
// The Java child of hutch_kernels.py: a JShell in this JVM; one cell per
// stdin line (base64), split into snippets, evaluated in order; the answer
// is one JSON line on fd 3. SIGINT stops the running snippet.
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import jdk.jshell.*;

public class HutchJShell {
    static String q(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    public static void main(String[] args) throws Exception {
        PrintStream ctl = new PrintStream(new FileOutputStream("/dev/fd/" + System.getenv().getOrDefault("HUTCH_CTL_FD", "3")), true, "UTF-8");
        JShell js = JShell.builder().executionEngine("local").out(System.out).err(System.err).build();
        try {
            sun.misc.Signal.handle(new sun.misc.Signal("INT"), s -> js.stop());
        } catch (Throwable t) { /* no signals: no interrupts */ }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null;) {
            String code = new String(Base64.getDecoder().decode(line.trim()), StandardCharsets.UTF_8);
            String result = null, err = null, ename = "Error";
            SourceCodeAnalysis sca = js.sourceCodeAnalysis();
            String rest = code;
            while (err == null && !rest.isBlank()) {
                SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
                String src = ci.completeness().isComplete() ? ci.source() : rest;
                rest = ci.completeness().isComplete() ? ci.remaining() : "";
                for (SnippetEvent ev : js.eval(src)) {
                    if (ev.status() == Snippet.Status.REJECTED) {
                        StringBuilder m = new StringBuilder();
                        js.diagnostics(ev.snippet()).forEach(d -> m.append(d.getMessage(Locale.ROOT)).append('\n'));
                        err = m.toString().trim();
                        ename = "CompilationError";
                    } else if (ev.exception() != null) {
                        Throwable t = ev.exception();
                        ename = t instanceof EvalException ? ((EvalException) t).getExceptionClassName() : t.getClass().getName();
                        err = String.valueOf(t.getMessage());
                    } else if (ev.value() != null && ev.snippet() instanceof VarSnippet
                               && ((VarSnippet) ev.snippet()).subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND) {
                        result = ev.value();
                    } else if (ev.value() != null && ev.snippet().kind() == Snippet.Kind.EXPRESSION) {
                        result = ev.value();
                    } else {
                        result = null;
                    }
                }
            }
            System.out.flush();
            System.err.flush();
            if (err != null)
                ctl.println("{\"status\":\"error\",\"ename\":" + q(ename) + ",\"evalue\":" + q(err) + ",\"traceback\":[" + q(ename + ": " + err) + "]}");
            else if (result != null)
                ctl.println("{\"status\":\"ok\",\"data\":{\"text/plain\":" + q(result) + "}}");
            else
                ctl.println("{\"status\":\"ok\",\"data\":null}");
        }
    }
}
