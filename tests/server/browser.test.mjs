// The built-in chat page (GET /) in a headless Chromium driven by playwright-core: a prompt typed
// into the page and sent with Enter streams an answer equal to the API's greedy, non-streamed
// answer for the same messages; the stats line shows time to first token and tokens/s; a second
// message continues the same conversation; "clear" starts a new one, and Enter while a reply
// streams sends nothing. Skipped when Chromium is absent (scripts/setup.sh
// installs Debian's `chromium` where it can). SPECULA_SCREENSHOT=path saves a screenshot of the page
// after the conversation (docs/chat_page.png was made that way).
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { chromium } from "playwright-core";
import { startServer, post } from "./harness.mjs";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const skip = existsSync(CHROMIUM) ? false : `${CHROMIUM} is absent (apt-get install chromium, or set CHROMIUM)`;

// Prompts whose greedy answers from the shipped byte-level model have visible text (many prompts get
// only spaces); the first answer ends at EOS, the second at max_tokens.
const PROMPTS = ["hello", "Tell me more about Debian."];
const TIMEOUT_MS = 30000;

test("the chat page streams the API's greedy answers, with stats, over two turns", { skip, timeout: 120000 }, async () => {
  const server = await startServer();
  // launch() runs the browser on a fresh temporary profile (--user-data-dir) and removes it on close.
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1000, height: 720 } });
    page.setDefaultTimeout(TIMEOUT_MS);
    const problems = [];
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("console", (m) => { if (m.type() === "error") problems.push(`console error: ${m.text()}`); });

    const response = await page.goto(server.url + "/");
    assert.equal(response.status(), 200);
    assert.equal(await page.title(), "specula chat");
    // The header shows the served model once /v1/models answers.
    await page.locator("#model").filter({ hasText: /\S/ }).waitFor();

    const maxTokens = Number(await page.inputValue("#max-tokens"));
    assert.equal(maxTokens, 256, "the page's default max tokens");
    const temperature = Number(await page.inputValue("#temperature"));
    assert.equal(temperature, 0, "the page's default temperature is greedy");

    const messages = [];
    for (let turn = 0; turn < PROMPTS.length; turn++) {
      await page.locator("#prompt").fill(PROMPTS[turn]);
      await page.locator("#prompt").press("Enter");
      const user = page.locator("#log > .msg.user").nth(turn);
      assert.equal(await user.textContent(), PROMPTS[turn]);
      assert.equal(await page.inputValue("#prompt"), "", "the prompt box is cleared on send");
      // The reply element: still .assistant when done unless the request failed (then .error).
      const reply = page.locator('#log > .msg[data-state="done"]').nth(turn);
      await reply.waitFor();
      const cls = await reply.getAttribute("class");
      const answer = await reply.textContent();
      assert.equal(cls, "msg assistant", `the reply is no error: ${answer}`);

      messages.push({ role: "user", content: PROMPTS[turn] });
      const api = await post(server.url, "/v1/chat/completions", { messages, temperature: 0, max_tokens: maxTokens });
      assert.equal(api.status, 200, api.text);
      const expected = api.json.choices[0].message.content;
      assert.match(expected, /\S/, "the greedy answer is not blank");
      assert.equal(answer, expected, `turn ${turn + 1}: the page's streamed answer equals the API's greedy answer`);
      messages.push({ role: "assistant", content: expected });

      const stats = await reply.locator("xpath=following-sibling::div[1]").textContent();
      const m = stats.match(/^(\d+) tokens · time to first token (\d+) ms · (\d+(?:\.\d+)?) tokens\/s$/);
      assert.ok(m, `stats line with numbers: ${JSON.stringify(stats)}`);
      assert.equal(Number(m[1]), api.json.usage.completion_tokens, "the stats count the completion tokens");
      assert.ok(Number(m[3]) > 0, "tokens/s is positive");
      assert.equal(await page.locator("#send").isDisabled(), false, "Send is enabled again");
    }
    assert.equal(await page.locator("#log > .msg").count(), 4, "two user and two assistant messages");

    if (process.env.SPECULA_SCREENSHOT) await page.screenshot({ path: process.env.SPECULA_SCREENSHOT, fullPage: true });

    // "clear" starts a new conversation, and Enter while a reply streams sends nothing: send() disables
    // Send synchronously, so a second Enter in the same task finds it disabled and leaves the box as is.
    await page.locator("#clear").click();
    assert.equal(await page.locator("#log > *").count(), 0);
    await page.evaluate(([first, second]) => {
      const box = document.getElementById("prompt");
      const enter = () => box.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true, cancelable: true }));
      box.value = first;
      enter();
      box.value = second;
      enter();
    }, [PROMPTS[0], "not sent"]);
    const reply = page.locator('#log > .msg[data-state="done"]').first();
    await reply.waitFor();
    assert.equal(await page.locator("#log > .msg").count(), 2, "one user message and its reply");
    assert.equal(await page.inputValue("#prompt"), "not sent", "the prompt typed while streaming stays in the box");
    assert.equal(await reply.textContent(), messages[1].content, "after clear, the first answer again");
    assert.deepEqual(problems, [], "no errors in the page");
  } finally {
    await browser.close();
    const { code } = await server.stop();
    assert.equal(code, 0, "the server exits 0 on SIGTERM");
  }
});
