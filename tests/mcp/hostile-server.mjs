// An MCP server written with the official SDK for tests/test_mcp.c: the cases the published servers lack.
// Tools: echo {message}; fail (isError); hang (never answers; records its cancellation); flood {n} (n progress
// notifications, then an answer); garbage (a line that is not JSON-RPC and an answer to an unknown id, then its
// own answer); wedge (blocks its event loop: answers nothing, not even ping); pid (its process id); act
// {action, ...} (the tool action names, with the same arguments).
// Arguments: --record FILE (what it received of interest, one JSON line each), --hang-initialize (never
// answers initialize: no SDK at all, it only reads).
import { appendFileSync } from 'node:fs';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const argv = process.argv.slice(2);
const recordAt = argv.indexOf('--record');
const recordFile = recordAt >= 0 ? argv[recordAt + 1] : null;
const record = (what) => {
    if (recordFile) appendFileSync(recordFile, JSON.stringify(what) + '\n');
};

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
        { name: 'act', description: 'Does what action names', inputSchema: object({ action: { type: 'string' } }) },
    ];
    server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
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
            default:
                return { content: [{ type: 'text', text: `no tool ${request.params.name}` }], isError: true };
        }
    });
    record({ started: process.pid });
    await server.connect(new StdioServerTransport());
}
