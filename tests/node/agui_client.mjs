// Drives a thoughtgate daemon with the real AG-UI client (@ag-ui/client's HttpAgent), as an
// AG-UI front end would, and prints one JSON document on stdout: every event the client applied
// (after its own protocol verification) and the messages it ended up with.
//
//   node agui_client.mjs URL KEY '{"prompt": "...", "forwardedProps": {...}}'
import { HttpAgent } from "@ag-ui/client";

const [url, key, spec] = process.argv.slice(2);
const { prompt, forwardedProps, messages } = JSON.parse(spec);

const agent = new HttpAgent({
  url,
  headers: { Authorization: `Bearer ${key}` },
  threadId: "thread-under-test",
  initialMessages: messages ?? [{ id: "m-user", role: "user", content: prompt }],
});

const events = [];
const out = { events, messages: [], error: null, runError: null };
try {
  await agent.runAgent(
    { runId: "client-run-1", forwardedProps: forwardedProps ?? {} },
    {
      onEvent: ({ event }) => {
        events.push(event);
      },
      onRunErrorEvent: ({ event }) => {
        out.runError = { message: event.message, code: event.code ?? null };
      },
    },
  );
} catch (error) {
  out.error = String(error?.message ?? error);
}
out.messages = agent.messages;
process.stdout.write(JSON.stringify(out));
