// The openai npm SDK uploading a recording the way its README shows: fs.createReadStream (sent as a
// chunked multipart body, no Content-Length). Prints {"text"} or {"status", "error"} as one JSON line.
// Usage: node upload_transcription.mjs <base URL> <API token> <audio file>
import fs from "node:fs";
import OpenAI from "openai";

const [base, token, path] = process.argv.slice(2);
const client = new OpenAI({ apiKey: token, baseURL: base + "/v1", maxRetries: 0 });
try {
  const result = await client.audio.transcriptions.create({ file: fs.createReadStream(path), model: "whisper-1" });
  console.log(JSON.stringify({ text: result.text }));
} catch (err) {
  console.log(JSON.stringify({ status: err.status, error: err.error }));
}
