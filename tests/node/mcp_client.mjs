// An MCP host's side, with the official TypeScript SDK (@modelcontextprotocol/sdk): start
// `thoughtgate mcp` over stdio, read what it declares, run a prompt while asking for progress, and
// print one JSON document on stdout. The SDK validates structured results against each tool's
// output schema, as hosts do.
//
// `progress` is what the SDK handed to `onprogress`; `wireProgress` is every progress notification
// that came over the wire, recorded before the SDK dispatches it. The SDK 1.x drops a notification
// it reads together with the response (modelcontextprotocol/typescript-sdk#2580): on a busy machine
// that can be any tail of them, or all.
//
//   node mcp_client.mjs PYTHON DB ROLE '{"prompt": ..., "model": ..., "chain_of_thought": ...}' [EXTRA_ARGS_JSON]
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [python, db, role, argsJson, extraJson] = process.argv.slice(2);
const extra = extraJson ? JSON.parse(extraJson) : [];

const transport = new StdioClientTransport({
  command: python,
  args: ["-m", "thoughtgate", "mcp", "--db", db, "--role", role, ...extra],
  env: { ...process.env },
  stderr: "pipe",
});
let stderr = "";
transport.stderr?.on("data", (chunk) => {
  stderr += chunk.toString();
});

const client = new Client({ name: "thoughtgate-test-host", version: "1.0.0" });
const out = { progress: [], wireProgress: [] };
try {
  await client.connect(transport);
  const dispatch = transport.onmessage;
  transport.onmessage = (message, extra) => {
    if (message.method === "notifications/progress") out.wireProgress.push(message.params);
    dispatch?.(message, extra);
  };
  out.serverVersion = client.getServerVersion();
  out.capabilities = client.getServerCapabilities();
  out.tools = (await client.listTools()).tools;
  out.result = await client.callTool(
    { name: "orchestration_run", arguments: JSON.parse(argsJson) },
    undefined,
    {
      onprogress: (p) => out.progress.push(p),
      timeout: 60000,
    },
  );
  out.status = await client.callTool({
    name: "orchestration_status",
    arguments: { run_id: out.result.structuredContent?.run_id ?? "none" },
  });
  out.badArguments = await client.callTool({
    name: "orchestration_run",
    arguments: { prompt: "x", chain_of_thought: "loud" },
  });
} catch (error) {
  out.error = String(error?.message ?? error);
} finally {
  await client.close();
}
out.stderr = stderr;
process.stdout.write(JSON.stringify(out));
