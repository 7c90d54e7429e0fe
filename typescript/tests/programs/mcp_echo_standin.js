// A stand-in for the MCP tool mcp_echo (typescript/tests): {"message": m} answers what an MCP server's echo tool
// gives through the worker, {"content": [{"type": "text", "text": "Echo: m"}]}.
import { ToolError, runTool } from "../../src/index.js";

runTool((c) => {
  if (typeof c.args.message !== "string") throw new ToolError("mcp_tool_error", "message must be a string");
  return { content: [{ type: "text", text: `Echo: ${c.args.message}` }] };
});
