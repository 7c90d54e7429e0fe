// An MCP server written with the official SDK for tests/test_mcp.c: the cases the published servers lack.
// Tools: echo {message}; fail (isError); hang (never answers; records its cancellation); flood {n} (n progress
// notifications, then an answer); garbage (a line that is not JSON-RPC and an answer to an unknown id, then its
// own answer); wedge (blocks its event loop: answers nothing, not even ping, and burns CPU); pid (its process
// id); slow {ms, gate} (answers after ms, or once the file gate exists, recording how many calls it had in hand
// at once); malformed {kind} (answers its own request with a line that is no JSON-RPC 2.0 answer: kind
// "nojsonrpc", "neither" or "result", then never answers); rpc_error (a JSON-RPC error answer); trickle {ms,
// every} (a progress notification every `every` ms for ms, then an answer); act {action, ...} (the tool action
// names, with the same arguments).
// Arguments: --record FILE (what it received of interest, one JSON line each), --hang-initialize (never
// answers initialize: no SDK at all, it only reads), --protocol-version V (answers initialize with version V,
// whatever the client asked), --deaf-to-ping (never answers ping; records each).
import { appendFileSync, existsSync } from 'node:fs';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import {
    CallToolRequestSchema,
    ErrorCode,
    ListToolsRequestSchema,
    McpError,
    PingRequestSchema,
} from '@modelcontextprotocol/sdk/types.js';

const argv = process.argv.slice(2);
const recordAt = argv.indexOf('--record');
const recordFile = recordAt >= 0 ? argv[recordAt + 1] : null;
const record = (what) => {
    if (recordFile) appendFileSync(recordFile, JSON.stringify(what) + '\n');
};
const versionAt = argv.indexOf('--protocol-version');
const forcedVersion = versionAt >= 0 ? argv[versionAt + 1] : null;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
let inHand = 0;

if (argv.includes('--hang-initialize')) {
    record({ started: process.pid, hang_initialize: true });
    process.stdin.on('data', () => {});
} else {
    const server = new Server({ name: 'turnwatch-hostile', version: '1.0.0' }, { capabilities: { tools: {} } });
    const object = (properties = {}) => ({ type: 'object', properties });
    const tools = [
        { name: 'echo', description: 'Echoes message', inputSchema: object({ message: { type: 'string' } }) },
        { name: 'fail', description: 'Answers isError', inputSchema: object() },
        { name: 'hang', description: 'Never answers', inputSchema: object() },
        { name: 'flood', description: 'Floods progress', inputSchema: object({ n: { type: 'number' } }) },
        { name: 'garbage', description: 'Writes garbage first', inputSchema: object() },
        { name: 'wedge', description: 'Blocks its event loop', inputSchema: object() },
        { name: 'pid', description: 'Its process id', inputSchema: object() },
        {
            name: 'slow',
            description: 'Answers after ms, or once the file gate exists',
            inputSchema: object({ ms: { type: 'number' }, gate: { type: 'string' } }),
        },
        { name: 'malformed', description: 'A bad answer', inputSchema: object({ kind: { type: 'string' } }) },
        { name: 'rpc_error', description: 'A JSON-RPC error', inputSchema: object() },
        { name: 'trickle', description: 'Progress for a while', inputSchema: object({ ms: { type: 'number' } }) },
        { name: 'act', description: 'Does what action names', inputSchema: object({ action: { type: 'string' } }) },
    ];
    server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
    if (argv.includes('--deaf-to-ping'))
        server.setRequestHandler(PingRequestSchema, (request, extra) => {
            record({ ping_ignored: extra.requestId });
            return new Promise(() => {});
        });
    server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
        const args = request.params.arguments ?? {};
        // act {action, ...}: one tool that does what action names, so that one tool section (one server)
        // can provoke every case at once.
        if (request.params.name === 'act') request.params.name = String(args.action ?? 'echo');
        const token = request.params._meta?.progressToken;
        record({ call: request.params.name, id: extra.requestId, token: token ?? null });
        const text = (t) => ({ content: [{ type: 'text', text: t }] });
        switch (request.params.name) {
            case 'echo':
                return text(`echo: ${args.message}`);
            case 'fail':
                return { content: [{ type: 'text', text: 'it broke on purpose' }], isError: true };
            case 'hang':
                return new Promise(() => {
                    const cancelled = () =>
                        record({ cancelled: extra.requestId, reason: String(extra.signal.reason ?? '') });
                    if (extra.signal.aborted) cancelled();
                    else extra.signal.addEventListener('abort', cancelled);
                });
            case 'flood': {
                const n = Number(args.n ?? 1000);
                for (let i = 1; i <= n; i++)
                    await extra.sendNotification({
                        method: 'notifications/progress',
                        params: { progressToken: token, progress: i, total: n, message: `flood ${i} of ${n}` },
                    });
                return text(`flooded ${n}`);
            }
            case 'garbage':
                process.stdout.write('this line is not JSON at all\n');
                process.stdout.write('{"jsonrpc":"2.0","id":987654321,"result":{"content":[]}}\n');
                process.stdout.write('[1,2,3]\n');
                return text('after the garbage');
            case 'wedge':
                record({ wedged: process.pid });
                for (;;) {
                    /* answers nothing from now on, not even ping */
                }
            case 'pid':
                return text(String(process.pid));
            case 'slow': {
                inHand++;
                record({ slow: extra.requestId, in_hand: inHand });
                if (args.gate) while (!existsSync(String(args.gate))) await sleep(50);
                else await sleep(Number(args.ms ?? 1000));
                inHand--;
                record({ slow_done: extra.requestId });
                return text(`slept ${args.ms}`);
            }
            case 'malformed': {
                const id = extra.requestId;
                const line = {
                    nojsonrpc: { id, result: { content: [] } },
                    neither: { jsonrpc: '2.0', id },
                    result: { jsonrpc: '2.0', id, result: 'not an object' },
                }[String(args.kind)];
                process.stdout.write(JSON.stringify(line) + '\n');
                return new Promise(() => {});
            }
            case 'rpc_error':
                throw new McpError(ErrorCode.InvalidParams, 'bad arguments on purpose');
            case 'trickle': {
                const ms = Number(args.ms ?? 5000), every = Number(args.every ?? 200);
                for (let waited = 0, i = 1; waited < ms; waited += every, i++) {
                    await extra.sendNotification({
                        method: 'notifications/progress',
                        params: { progressToken: token, progress: i, message: `trickle ${i}` },
                    });
                    await sleep(every);
                }
                return text(`trickled ${ms}`);
            }
            default:
                return { content: [{ type: 'text', text: `no tool ${request.params.name}` }], isError: true };
        }
    });
    record({ started: process.pid });
    const transport = new StdioServerTransport();
    if (forcedVersion) {
        // The SDK answers with the version the client asked for when it knows it: a server that speaks only an
        // older one, or one nobody speaks, is made by rewriting its answer on the way out.
        const send = transport.send.bind(transport);
        transport.send = (message, options) => {
            if (message.result?.protocolVersion) message.result.protocolVersion = forcedVersion;
            return send(message, options);
        };
    }
    await server.connect(transport);
}
